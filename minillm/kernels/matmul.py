"""Tiled matmul: each program computes one [BLOCK_M, BLOCK_N] tile of C = A @ B, walking K in
steps of BLOCK_K and accumulating in float32.

A tile of A is reused BLOCK_N times and a tile of B BLOCK_M times from fast memory, which is what
lifts a matmul from memory-bound to compute-bound: arithmetic intensity grows with the tile.
`tl.dot` runs on the tensor cores; input_precision="ieee" keeps float32 inputs in full float32
(tf32 would round them to 10 mantissa bits, unlike torch's default float32 matmul).
"""
import torch

from minillm.kernels.runtime import check_device, tl, triton


def matmul_spec(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a: [M, K]; b: [K, N] -> [M, N], accumulated in float32, returned in a's dtype"""
    return (a.float() @ b.float()).to(a.dtype)

@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] rows of C
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N] columns of C
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(a_ptr + rm[:, None] * stride_am + rk[None, :] * stride_ak,
                    mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)  # [BLOCK_M, BLOCK_K]
        b = tl.load(b_ptr + rk[:, None] * stride_bk + rn[None, :] * stride_bn,
                    mask=(rk[:, None] < K) & (rn[None, :] < N), other=0.0)  # [BLOCK_K, BLOCK_N]
        acc = tl.dot(a, b, acc, input_precision="ieee")
    tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, acc.to(c_ptr.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))

def matmul(a: torch.Tensor, b: torch.Tensor, block_m: int = 64, block_n: int = 64, block_k: int = 32) -> torch.Tensor:
    """a: [M, K]; b: [K, N], same dtype (any strides) -> [M, N]. Blocks: powers of two, >= 16."""
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0] or a.dtype != b.dtype:
        raise ValueError(f"matmul takes a [M, K] and b [K, N] of one dtype, got {tuple(a.shape)} {a.dtype} and "
                         f"{tuple(b.shape)} {b.dtype}")
    check_device(a, b)
    (m, k), n = a.shape, b.shape[1]
    c = torch.empty(m, n, dtype=a.dtype, device=a.device)
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    matmul_kernel[grid](a, b, c, m, n, k, *a.stride(), *b.stride(), *c.stride(),
                        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k)
    return c
