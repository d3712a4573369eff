"""Computes in float32 whatever the dtype of p and q: float64 distributions lose their small differences."""
EXERCISE = "5.2"


def residual(p, q):
    r = (p.float() - q.float()).clamp(min=0)
    total = r.sum()
    return r / total if total > 0 else p
