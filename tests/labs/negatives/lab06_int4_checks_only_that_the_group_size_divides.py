"""Refuses a group size that leaves a remainder, but not 0 (ZeroDivisionError) or a negative one that divides."""
EXERCISE = "6.2"


def quantize_int4(w, group_size):
    out_features, in_features = w.shape
    if in_features % group_size:
        raise ValueError(f"group_size {group_size} does not divide {in_features}")
    groups = w.float().reshape(out_features, in_features // group_size, group_size)
    lo, hi = groups.amin(dim=2).clamp(max=0), groups.amax(dim=2).clamp(min=0)
    scale = ((hi - lo) / 15).clamp_min(TINY)
    zero = torch.round(-lo / scale).clamp(0, 15)
    codes = (torch.round(groups / scale[..., None]) + zero[..., None]).clamp(0, 15)
    return codes.reshape(out_features, in_features).to(torch.uint8), scale, zero.to(torch.uint8)
