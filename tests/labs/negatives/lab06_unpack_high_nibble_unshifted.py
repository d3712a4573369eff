"""Masks the high nibble (packed & 0xF0) without shifting it down: codes 16 times too large."""
EXERCISE = "6.4"


def unpack_int4(packed, n):
    pairs = torch.stack([packed & 0x0F, packed & 0xF0], dim=-1)
    return pairs.reshape(*packed.shape[:-1], -1)[..., :n]
