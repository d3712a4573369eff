"""Adds eps after the square root instead of inside it."""
EXERCISE = "1.1"


def rms_norm(x, weight, eps):
    return x / (x.pow(2).mean(-1, keepdim=True).sqrt() + eps) * weight
