"""Normalises |p - q| instead of its positive part."""
EXERCISE = "5.2"


def residual(p, q):
    r = (p - q).abs()
    return r / r.sum() if r.sum() > 0 else p
