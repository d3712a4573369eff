"""Sums the squares instead of averaging them."""
EXERCISE = "1.1"


def rms_norm(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps) * weight
