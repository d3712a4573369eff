"""Builds the weight in float32 for float32 inputs and in bfloat16 for any other: assumes the dtype instead of
reading it from x."""
EXERCISE = "6.5"


def int4_linear(x, packed, scale, zero, bias):
    out_features, in_features = packed.shape[0], x.shape[-1]
    codes = unpack_int4(packed, in_features).reshape(out_features, scale.shape[1], -1).float()
    weight = ((codes - zero[..., None].float()) * scale[..., None]).reshape(out_features, in_features)
    dtype = torch.float32 if x.dtype == torch.float32 else torch.bfloat16
    return F.linear(x.to(dtype), weight.to(dtype), None if bias is None else bias.to(dtype))
