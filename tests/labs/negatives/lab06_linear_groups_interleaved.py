"""Expands the per-group scales and zero points with repeat instead of repeat_interleave: input i
gets the parameters of group i % groups instead of i // group_size."""
EXERCISE = "6.5"


def int4_linear(x, packed, scale, zero, bias):
    in_features = x.shape[-1]
    group_size = in_features // scale.shape[1]
    codes = unpack_int4(packed, in_features).float()
    weight = (codes - zero.float().repeat(1, group_size)) * scale.repeat(1, group_size)
    return F.linear(x, weight.to(x.dtype), bias)
