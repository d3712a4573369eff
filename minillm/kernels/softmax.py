"""Row softmax, numerically stable: exp(x - max(x)) never overflows, and the sum is at least 1.

    softmax(x)_i = exp(x_i - m) / sum_j exp(x_j - m),   m = max_j x_j

A row that fits one block is read once. A longer row is read in blocks, twice: the first pass keeps
a running max m and a running sum l of exp(x - m), rescaling l by exp(m_old - m_new) whenever the
max grows (the "online softmax" of Milakov & Gimelshein 2018, the heart of FlashAttention); the
second pass writes exp(x - m) / l.
"""
import torch

from minillm.kernels.runtime import check_device, next_pow2, tl, triton


def softmax_spec(x: torch.Tensor) -> torch.Tensor:
    """x: [rows, cols] -> [rows, cols], computed in float32, returned in x's dtype"""
    return torch.softmax(x.float(), dim=-1).to(x.dtype)


@triton.jit
def softmax_kernel(x_ptr, out_ptr, cols, stride_x, stride_out, BLOCK: tl.constexpr, ONE_BLOCK: tl.constexpr):
    row = tl.program_id(0)
    x_row, out_row = x_ptr + row * stride_x, out_ptr + row * stride_out
    offsets = tl.arange(0, BLOCK)
    if ONE_BLOCK:
        mask = offsets < cols
        x = tl.load(x_row + offsets, mask=mask, other=-float("inf")).to(tl.float32)
        e = tl.exp(x - tl.max(x, axis=0))  # masked lanes: exp(-inf) = 0
        tl.store(out_row + offsets, (e / tl.sum(e, axis=0)).to(out_ptr.dtype.element_ty), mask=mask)
    else:
        m = -float("inf")
        s = 0.0
        for start in range(0, cols, BLOCK):
            mask = start + offsets < cols
            x = tl.load(x_row + start + offsets, mask=mask, other=-float("inf")).to(tl.float32)
            m_new = tl.maximum(m, tl.max(x, axis=0))
            s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
            m = m_new
        for start in range(0, cols, BLOCK):
            mask = start + offsets < cols
            x = tl.load(x_row + start + offsets, mask=mask, other=-float("inf")).to(tl.float32)
            tl.store(out_row + start + offsets, (tl.exp(x - m) / s).to(out_ptr.dtype.element_ty), mask=mask)


def softmax(x: torch.Tensor, block: int = 4096) -> torch.Tensor:
    """x: [rows, cols] -> [rows, cols]; rows longer than `block` (a power of two) go online."""
    if x.dim() != 2:
        raise ValueError(f"softmax takes a matrix [rows, cols], got shape {tuple(x.shape)}")
    check_device(x)
    if x.stride(1) != 1:
        x = x.contiguous()
    out = torch.empty_like(x)
    rows, cols = x.shape
    one = cols <= block
    softmax_kernel[(rows,)](x, out, cols, x.stride(0), out.stride(0), BLOCK=next_pow2(cols) if one else block,
                            ONE_BLOCK=one)
    return out
