"""Divides by the residual's sum plus an epsilon of its own (1e-12): off wherever the sum is small."""
EXERCISE = "5.2"


def residual(p, q):
    r = (p - q).clamp(min=0)
    total = r.sum()
    return r / (total + 1e-12) if total > 0 else p
