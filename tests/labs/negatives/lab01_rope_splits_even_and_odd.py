"""Builds rotate_half from the even and odd dimensions (the adjacent-pair split) with the rotate-half tables."""
EXERCISE = "1.3"


def apply_rope(x, cos, sin):
    x1, x2 = x[..., 0::2], x[..., 1::2]
    rotated = torch.cat([-x2, x1], dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]
