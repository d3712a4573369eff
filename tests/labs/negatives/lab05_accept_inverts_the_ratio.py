"""Keeps the token with probability min(1, q / p): the ratio upside down."""
EXERCISE = "5.1"


def accept(p, q, generator):
    return p > 0 and float(torch.rand((), generator=generator)) * p < q
