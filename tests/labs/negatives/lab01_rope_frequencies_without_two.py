"""Uses theta^(-i/d) instead of theta^(-2i/d) for the rotary frequencies."""
EXERCISE = "1.2"


def rope_cos_sin(positions, head_dim, theta):
    inv_freq = theta ** (-torch.arange(head_dim // 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(positions.float(), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()
