"""Multiplies by the reciprocal of the scale instead of dividing by it: the same codes almost everywhere, but a
weight exactly halfway between two codes lands a hair off the half and rounds to the other neighbour."""
EXERCISE = "6.1"


def quantize_int8(w):
    scale = (w.abs().amax(dim=1).float() / 127).clamp_min(TINY)
    q = torch.round(w.float() * (1 / scale[:, None])).clamp(-127, 127)
    return q.to(torch.int8), scale
