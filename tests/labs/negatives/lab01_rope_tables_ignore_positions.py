"""Builds the tables for positions 0..n-1 instead of the positions it is given."""
EXERCISE = "1.2"


def rope_cos_sin(positions, head_dim, theta):
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(positions.shape[0]).float(), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()
