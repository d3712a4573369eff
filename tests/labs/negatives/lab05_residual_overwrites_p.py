"""Subtracts in place (p -= q), changing the caller's p, which is also what it returns when p == q."""
EXERCISE = "5.2"


def residual(p, q):
    p -= q
    p.clamp_(min=0)
    total = p.sum()
    return p / total if total > 0 else p
