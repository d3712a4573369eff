"""Rounds halves up, floor(x + 0.5), instead of to the even integer as torch.round does."""
EXERCISE = "6.1"


def quantize_int8(w):
    scale = (w.abs().amax(dim=1).float() / 127).clamp_min(TINY)
    q = torch.floor(w.float() / scale[:, None] + 0.5).clamp(-127, 127)
    return q.to(torch.int8), scale
