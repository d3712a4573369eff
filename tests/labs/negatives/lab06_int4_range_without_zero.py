"""Spreads the codes from the group's min to its max without stretching the range to hold 0: a group
of only positive (or only negative) weights then needs a zero point outside 0..15, which is clamped."""
EXERCISE = "6.2"


def quantize_int4(w, group_size):
    out_features, in_features = w.shape
    if in_features % group_size:
        raise ValueError(f"group_size {group_size} does not divide {in_features}")
    groups = w.float().reshape(out_features, in_features // group_size, group_size)
    lo, hi = groups.amin(dim=2), groups.amax(dim=2)
    scale = ((hi - lo) / 15).clamp_min(TINY)
    zero = torch.round(-lo / scale).clamp(0, 15)
    codes = (torch.round(groups / scale[..., None]) + zero[..., None]).clamp(0, 15)
    return codes.reshape(out_features, in_features).to(torch.uint8), scale, zero.to(torch.uint8)
