"""Returns max(0, p - q) without dividing by its sum."""
EXERCISE = "5.2"


def residual(p, q):
    r = (p - q).clamp(min=0)
    return r if r.sum() > 0 else p
