"""Rotates adjacent dimensions (2i, 2i+1), the RoPE paper's pairing, instead of rotate-half."""
EXERCISE = "1.3"


def apply_rope(x, cos, sin):
    half = x.shape[-1] // 2
    c, s = cos[:, None, :half], sin[:, None, :half]
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack([even * c - odd * s, even * s + odd * c], dim=-1).flatten(-2)
