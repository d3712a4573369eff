"""Leaves the scale of a row of zeros at 0 (0 / 0 gives NaN codes)."""
EXERCISE = "6.1"


def quantize_int8(w):
    scale = w.abs().amax(dim=1).float() / 127
    q = torch.round(w.float() / scale[:, None]).clamp(-127, 127)
    return q.to(torch.int8), scale
