"""Truncates w / scale toward zero instead of rounding to the nearest code."""
EXERCISE = "6.1"


def quantize_int8(w):
    scale = (w.abs().amax(dim=1).float() / 127).clamp_min(TINY)
    q = torch.trunc(w.float() / scale[:, None]).clamp(-127, 127)
    return q.to(torch.int8), scale
