"""Lays the angle table out for adjacent pairs (a0 a0 a1 a1 ...) instead of rotate-half halves."""
EXERCISE = "1.2"


def rope_cos_sin(positions, head_dim, theta):
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(positions.float(), inv_freq).repeat_interleave(2, dim=-1)
    return angles.cos(), angles.sin()
