"""int4 dequantize fused into the matmul: y = x @ dequant(W).T + b, without ever writing the
dequantized weight to memory.

The engine's int4 format (int4_format.py; minillm/quant/codecs.py writes it): codes 0..15, two a
byte along a row, the even element in the low nibble; one float32 scale and one uint8 zero point
per group of `group_size` consecutive inputs of a row; w = (q - zero) * scale. Decode is
memory-bound, so reading 4-bit codes (plus 5 bytes a group) instead of 16-bit weights is the
speed-up; the unpacking is a few integer ops per weight, done in registers on the tile just loaded.
"""
import torch
import torch.nn.functional as F

from minillm.kernels.int4_format import dequantize_int4, unpack_int4
from minillm.kernels.runtime import INTERPRETED, check_device, tl, triton


def int4_linear_spec(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor,
                     bias: torch.Tensor | None) -> torch.Tensor:
    """x: [n, in]; packed: uint8 [out, ceil(in / 2)]; scale, zero: [out, in // group_size]; bias: [out] -> [n, out]"""
    w = dequantize_int4(unpack_int4(packed, x.shape[-1]), scale, zero)  # [out, in] float32
    return F.linear(x, w.to(x.dtype), bias)


@triton.jit
def int4_matmul_kernel(x_ptr, q_ptr, s_ptr, z_ptr, b_ptr, y_ptr, M, N, K, group_size,
                       stride_xm, stride_xk, stride_qn, stride_sn, stride_zn, stride_ym, stride_yn,
                       HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] rows of x and y
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N] output features: rows of W
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)  # [BLOCK_K] input features
        x = tl.load(x_ptr + rm[:, None] * stride_xm + rk[None, :] * stride_xk,
                    mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)  # [BLOCK_M, BLOCK_K]
        w_mask = (rn[:, None] < N) & (rk[None, :] < K)  # [BLOCK_N, BLOCK_K]
        byte = tl.load(q_ptr + rn[:, None] * stride_qn + (rk // 2)[None, :], mask=w_mask, other=0).to(tl.int32)
        code = (byte >> ((rk % 2) * 4)[None, :]) & 0xF  # even k: low nibble, odd k: high nibble
        group = (rk // group_size)[None, :]
        scale = tl.load(s_ptr + rn[:, None] * stride_sn + group, mask=w_mask, other=0.0)
        zero = tl.load(z_ptr + rn[:, None] * stride_zn + group, mask=w_mask, other=0).to(tl.float32)
        w = (code.to(tl.float32) - zero) * scale  # [BLOCK_N, BLOCK_K], the dequantized tile, in registers
        acc = tl.dot(x, tl.trans(w.to(x.dtype)), acc, input_precision="ieee")
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :] * stride_yn, acc.to(y_ptr.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


def int4_linear(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor,
                bias: torch.Tensor | None) -> torch.Tensor:
    """QuantOps.int4_linear's interface. x: [..., in]; packed: uint8 [out, ceil(in / 2)];
    scale, zero: [out, in // group_size]; bias: [out] or None -> [..., out]."""
    k = x.shape[-1]
    n, groups = scale.shape
    if packed.shape != (n, (k + 1) // 2) or zero.shape != scale.shape or groups < 1 or k % groups:
        raise ValueError(f"int4_linear: x [..., {k}] needs packed [out, {(k + 1) // 2}] and scale, zero [out, groups] "
                         f"with groups dividing {k}; got packed {tuple(packed.shape)}, scale {tuple(scale.shape)}, "
                         f"zero {tuple(zero.shape)}")
    check_device(x, packed, scale, zero, bias)
    x2 = x.reshape(-1, k)  # [M, in]
    m = x2.shape[0]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    # The interpreter pays per program and per loop step, not per element: big tiles there.
    block_m = 16 if m <= 16 else (32 if INTERPRETED else 64)
    block_n, block_k = (128, 128) if INTERPRETED else (64, 64)
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    int4_matmul_kernel[grid](x2, packed, scale, zero, bias if bias is not None else scale, y, m, n, k, k // groups,
                             x2.stride(0), x2.stride(1), packed.stride(0), scale.stride(0), zero.stride(0),
                             y.stride(0), y.stride(1), HAS_BIAS=bias is not None,
                             BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k)
    return y.view(*x.shape[:-1], n)
