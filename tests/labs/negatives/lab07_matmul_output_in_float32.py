"""C is allocated as torch.empty(m, n): float32, whatever the operands' dtype."""
EXERCISE = "7.4"


def matmul(a: Tensor, b: Tensor, block_m: int = 64, block_n: int = 64, block_k: int = 32) -> Tensor:
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0] or a.dtype != b.dtype:
        raise ValueError("matmul takes a [M, K] and b [K, N] of one dtype")
    check_device(a, b)
    (m, k), n = a.shape, b.shape[1]
    c = torch.empty(m, n, device=a.device)
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    matmul_kernel[grid](a, b, c, m, n, k, *a.stride(), *b.stride(), *c.stride(),
                        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k)
    return c
