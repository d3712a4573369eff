"""Forgets to pad an odd number of codes: the even and odd halves then differ in length."""
EXERCISE = "6.3"


def pack_int4(codes):
    codes = codes.to(torch.uint8)
    return codes[..., 0::2] | (codes[..., 1::2] << 4)
