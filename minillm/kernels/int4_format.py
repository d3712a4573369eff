"""The packed int4 weight format: what quant/codecs.py writes and kernels/int4_matmul.py reads.

W: [out, in] is stored as codes 0..15, two a byte along a row (the even element in the low nibble),
with one float32 scale and one uint8 zero point per group of `group_size` consecutive inputs of a
row: w = (q - zero) * scale. The codec that chooses the codes (quantize_int4) and the kernel that
reads them agree on this layout, so it lives here, below both: plain PyTorch (importing it does not
import triton), in the lower layer, so the kernels import nothing of quant/.
"""
import torch

INT4_MAX = 15           # unsigned 4-bit codes 0..15


def dequantize_int4(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    """codes: uint8 [out, in], scale: [out, groups], zero: [out, groups] -> float32 [out, in].
    The group size is in // groups."""
    out_features, in_features = codes.shape
    groups = codes.reshape(out_features, scale.shape[1], -1).float()  # [out, groups, g]
    return ((groups - zero[..., None].float()) * scale[..., None]).reshape(out_features, in_features)


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """Two 4-bit codes per byte along the last dimension: element 2i in the low nibble, 2i+1 in the
    high one. codes: uint8 [..., n] in 0..15 -> uint8 [..., ceil(n / 2)] (an odd n is padded with 0)."""
    if codes.shape[-1] % 2:
        codes = torch.nn.functional.pad(codes, (0, 1))
    pairs = codes.to(torch.uint8).reshape(*codes.shape[:-1], -1, 2)  # [..., n / 2, 2]
    return pairs[..., 0] | (pairs[..., 1] << 4)


def unpack_int4(packed: torch.Tensor, n: int) -> torch.Tensor:
    """The inverse of pack_int4. packed: uint8 [..., ceil(n / 2)] -> uint8 [..., n]."""
    pairs = torch.stack([packed & 0x0F, packed >> 4], dim=-1)  # [..., ceil(n / 2), 2]
    return pairs.reshape(*packed.shape[:-1], -1)[..., :n]
