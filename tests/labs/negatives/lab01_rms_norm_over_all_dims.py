"""Takes the mean square over the whole tensor instead of per vector."""
EXERCISE = "1.1"


def rms_norm(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean() + eps) * weight
