"""Unpacks two codes per byte (the padding of an odd number of inputs included) instead of x's inputs."""
EXERCISE = "6.5"


def int4_linear(x, packed, scale, zero, bias):
    out_features = packed.shape[0]
    codes = unpack_int4(packed, 2 * packed.shape[1]).reshape(out_features, scale.shape[1], -1).float()
    weight = ((codes - zero[..., None].float()) * scale[..., None]).reshape(out_features, -1)
    return F.linear(x, weight.to(x.dtype), bias)
