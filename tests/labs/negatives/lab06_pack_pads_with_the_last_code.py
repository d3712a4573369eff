"""Pads an odd number of codes by repeating the last code instead of with 0."""
EXERCISE = "6.3"


def pack_int4(codes):
    if codes.shape[-1] % 2:
        codes = torch.cat([codes, codes[..., -1:]], dim=-1)
    codes = codes.to(torch.uint8)
    return codes[..., 0::2] | (codes[..., 1::2] << 4)
