"""Keeps the token when the uniform draw is above p / q, so with probability 1 - p / q."""
EXERCISE = "5.1"


def accept(p, q, generator):
    return float(torch.rand((), generator=generator)) > min(1.0, p / q) if q > 0 else True
