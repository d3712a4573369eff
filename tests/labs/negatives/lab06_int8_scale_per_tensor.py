"""One int8 scale for the whole matrix (its largest |w|) instead of one per output channel."""
EXERCISE = "6.1"


def quantize_int8(w):
    scale = (w.abs().max().float() / 127).clamp_min(TINY).expand(w.shape[0]).contiguous()
    q = torch.round(w.float() / scale[:, None]).clamp(-127, 127)
    return q.to(torch.int8), scale
