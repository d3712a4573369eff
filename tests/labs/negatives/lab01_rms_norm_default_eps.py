"""Adds the common default epsilon 1e-6 instead of the eps it is given."""
EXERCISE = "1.1"


def rms_norm(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * weight
