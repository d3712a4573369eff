"""Returns every nibble, the padding code of an odd n included."""
EXERCISE = "6.4"


def unpack_int4(packed, n):
    pairs = torch.stack([packed & 0x0F, packed >> 4], dim=-1)
    return pairs.reshape(*packed.shape[:-1], -1)
