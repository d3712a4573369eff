"""Keeps the token with a Bernoulli draw of p / q, forgetting to clamp it to 1 (and to guard q = 0)."""
EXERCISE = "5.1"


def accept(p, q, generator):
    return bool(torch.bernoulli(torch.tensor(p / q), generator=generator))
