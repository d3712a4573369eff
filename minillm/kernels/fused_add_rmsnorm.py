"""RMSNorm with the residual add fused in: one program per row reads x and the residual once,
writes the new residual and the normalised row once (unfused: three passes over the row).

    h = x + residual;   y = h / sqrt(mean(h^2) + eps) * weight        -> (y, h)

This is the decoder layer's `x = x + attn(...)` followed by the next norm. Statistics in float32;
below float32 the normalised row is rounded to the model's dtype before the gain, in the order
minillm/layers/rmsnorm.py (and Hugging Face's Llama) use. A row is one block (hidden <= 64k).
"""
import torch
import torch.nn.functional as F

from minillm.kernels.runtime import check_device, next_pow2, tl, triton


def rmsnorm_residual_spec(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                          eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """x, residual: [rows, hidden]; weight: [hidden] -> (y [rows, hidden], h = x + residual)"""
    h = x + residual
    if h.dtype == torch.float32:
        return F.rms_norm(h, weight.shape, weight, eps), h
    return weight * F.rms_norm(h.float(), weight.shape, eps=eps).to(h.dtype), h


@triton.jit
def rmsnorm_residual_kernel(x_ptr, res_ptr, w_ptr, y_ptr, h_ptr, hidden, eps,
                            stride_x, stride_r, stride_y, stride_h, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    r = tl.load(res_ptr + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
    h = (x + r).to(h_ptr.dtype.element_ty)  # the residual stream keeps the model's dtype
    tl.store(h_ptr + row * stride_h + cols, h, mask=mask)
    h = h.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(h * h, axis=0) / hidden + eps)  # masked columns add 0
    normed = (h * rstd).to(y_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * stride_y + cols, (normed * w).to(y_ptr.dtype.element_ty), mask=mask)


def rmsnorm_residual(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """x, residual: [rows, hidden] (rows may be strided); weight: [hidden] -> (y, h), both [rows, hidden]"""
    if x.shape != residual.shape or x.dim() != 2 or weight.shape != x.shape[1:]:
        raise ValueError(f"rmsnorm_residual takes x and residual [rows, hidden] and weight [hidden], got "
                         f"{tuple(x.shape)}, {tuple(residual.shape)} and {tuple(weight.shape)}")
    check_device(x, residual, weight)
    if x.stride(1) != 1 or residual.stride(1) != 1:
        x, residual = x.contiguous(), residual.contiguous()
    rows, hidden = x.shape
    y, h = torch.empty_like(x), torch.empty_like(x)
    rmsnorm_residual_kernel[(rows,)](x, residual, weight.contiguous(), y, h, hidden, eps, x.stride(0),
                                     residual.stride(0), y.stride(0), h.stride(0), BLOCK=next_pow2(hidden))
    return y, h
