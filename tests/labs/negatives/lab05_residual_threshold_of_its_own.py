"""Treats a residual mass below 1e-6 as none and returns p: wrong when p and q differ only a little."""
EXERCISE = "5.2"


def residual(p, q):
    r = (p - q).clamp(min=0)
    total = r.sum()
    return r / total if total > 1e-6 else p
