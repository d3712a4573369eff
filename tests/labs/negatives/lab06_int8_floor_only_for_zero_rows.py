"""Replaces a scale by TINY only where it is exactly 0: a row whose scale falls below TINY (but not to 0) keeps it."""
EXERCISE = "6.1"


def quantize_int8(w):
    scale = w.abs().amax(dim=1).float() / 127
    scale = torch.where(scale == 0, torch.full_like(scale, TINY), scale)
    q = torch.round(w.float() / scale[:, None]).clamp(-127, 127)
    return q.to(torch.int8), scale
