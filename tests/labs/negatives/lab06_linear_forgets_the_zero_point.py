"""Dequantizes as codes * scale, without subtracting the zero point."""
EXERCISE = "6.5"


def int4_linear(x, packed, scale, zero, bias):
    out_features, in_features = packed.shape[0], x.shape[-1]
    codes = unpack_int4(packed, in_features).reshape(out_features, scale.shape[1], -1).float()
    weight = (codes * scale[..., None]).reshape(out_features, in_features)
    return F.linear(x, weight.to(x.dtype), bias)
