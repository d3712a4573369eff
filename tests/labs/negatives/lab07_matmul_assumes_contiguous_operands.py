"""The launcher passes the strides of contiguous matrices, whatever a and b are."""
EXERCISE = "7.4"


def matmul(a: Tensor, b: Tensor, block_m: int = 64, block_n: int = 64, block_k: int = 32) -> Tensor:
    """C = A @ B on matmul_kernel.

    a: [M, K]; b: [K, N], same dtype, any strides -> [M, N] in a's dtype, accumulated in float32.
    Blocks: powers of two, at least 16 (tl.dot's smallest tile). Grid: (ceil(M / block_m), ceil(N / block_n)).

    Hints: kernel about 12 lines: rm and rn from the two program ids, a float32 tl.zeros accumulator,
    `for k0 in range(0, K, BLOCK_K)`, two masked 2-D loads, tl.dot(a, b, acc, input_precision="ieee"),
    a masked store. Launcher 3 lines: torch.empty, the grid, the launch with *a.stride(), *b.stride(), *c.stride().
    """
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0] or a.dtype != b.dtype:
        raise ValueError(f"matmul takes a [M, K] and b [K, N] of one dtype, got {tuple(a.shape)} {a.dtype} and "
                         f"{tuple(b.shape)} {b.dtype}")
    check_device(a, b)
    (m, k), n = a.shape, b.shape[1]
    c = torch.empty(m, n, dtype=a.dtype, device=a.device)
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    matmul_kernel[grid](a, b, c, m, n, k, k, 1, n, 1, *c.stride(),
                        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k)
    return c
