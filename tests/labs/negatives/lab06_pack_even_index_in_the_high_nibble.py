"""Packs the even-index code into the high nibble and the odd one into the low nibble."""
EXERCISE = "6.3"


def pack_int4(codes):
    if codes.shape[-1] % 2:
        codes = F.pad(codes, (0, 1))
    codes = codes.to(torch.uint8)
    return (codes[..., 0::2] << 4) | codes[..., 1::2]
