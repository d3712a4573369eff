"""GGUF tensor data -> float32, decoded from the definitions of ggml's formats (not with ggml's code).

Plain types are element arrays: F32, F16, and BF16 (the top 16 bits of a float32). The quantized
types cut each row into blocks of 32 values; a block stores its scale d (and for Q4_1 an offset m)
as fp16, then 32 codes q:

    Q8_0   d, 32 x int8               2 + 32 bytes   x = d * q
    Q4_0   d, 16 bytes of 4-bit q     2 + 16 bytes   x = d * (q - 8)
    Q4_1   d, m, 16 bytes of 4-bit q  4 + 16 bytes   x = d * q + m

In a 4-bit block, byte j holds value j in its low nibble and value j + 16 in its high nibble: the
block's first 16 values are the low nibbles, its last 16 the high ones (not neighbours in pairs).
An fp16 scale times a code of at most 8 bits needs at most 19 significant bits, so Q8_0 and Q4_0
values are exact in float32; Q4_1's `+ m` rounds once in float32, as ggml's own dequantization does.
"""
import numpy as np
import torch
from gguf import GGMLQuantizationType as T

BLOCK = 32  # values per quantized block, in every type read here
BLOCK_BYTES = {T.Q8_0: 2 + BLOCK, T.Q4_0: 2 + BLOCK // 2, T.Q4_1: 4 + BLOCK // 2}
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1")


def _fp16(blocks: np.ndarray, at: int) -> np.ndarray:
    """The fp16 stored at byte `at` of each block: [n_blocks, block_bytes] uint8 -> [n_blocks, 1] float32."""
    return blocks[:, at:at + 2].view(np.float16).astype(np.float32)


def _nibbles(packed: np.ndarray) -> np.ndarray:
    """[n_blocks, 16] uint8 -> [n_blocks, 32] codes 0..15: the low nibbles are values 0-15, the high ones 16-31."""
    return np.concatenate([packed & 0x0F, packed >> 4], axis=1)


def _decode_blocks(blocks: np.ndarray, qtype: T) -> np.ndarray:
    """[n_blocks, block_bytes] uint8 -> [n_blocks, 32] float32."""
    if qtype == T.Q8_0:
        return _fp16(blocks, 0) * blocks[:, 2:].view(np.int8).astype(np.float32)
    if qtype == T.Q4_0:
        return _fp16(blocks, 0) * (_nibbles(blocks[:, 2:]).astype(np.float32) - 8)
    return _fp16(blocks, 0) * _nibbles(blocks[:, 4:]).astype(np.float32) + _fp16(blocks, 2)  # Q4_1


def dequantize(name: str, data: np.ndarray, qtype: T) -> torch.Tensor:
    """One tensor as GGUFReader returns it -> float32 [rows..., row_length] (ggml's shape reversed,
    so a weight is [out_features, in_features] as in PyTorch).

    data: the element array for F32 / F16; for BF16 and the block types, the raw bytes
    [rows..., row_bytes] (uint8). Any other type raises ValueError naming the tensor and its type."""
    qtype = T(qtype)
    if qtype == T.F32:
        return torch.from_numpy(np.array(data, dtype=np.float32))
    if qtype == T.F16:
        return torch.from_numpy(np.asarray(data).astype(np.float32))
    if qtype == T.BF16:
        bits = np.ascontiguousarray(data).view(np.uint16).astype(np.uint32) << 16  # bf16 = a float32's high half
        return torch.from_numpy(bits.view(np.float32))
    if qtype not in BLOCK_BYTES:
        raise ValueError(f"tensor {name!r} is stored as {qtype.name}, which minillm cannot decode; it reads "
                         f"{', '.join(SUPPORTED_TYPES)} (convert or re-quantize the model to one of these)")
    rows, row_bytes = data.shape[:-1], data.shape[-1]
    if row_bytes % BLOCK_BYTES[qtype]:
        raise ValueError(f"tensor {name!r} ({qtype.name}) has rows of {row_bytes} bytes, not a whole number of "
                         f"{BLOCK_BYTES[qtype]}-byte blocks: the file is corrupt")
    blocks = np.ascontiguousarray(data).reshape(-1, BLOCK_BYTES[qtype])  # [n_blocks, block_bytes]
    values = _decode_blocks(blocks, qtype)  # [n_blocks, 32]
    return torch.from_numpy(values.reshape(*rows, row_bytes // BLOCK_BYTES[qtype] * BLOCK))
