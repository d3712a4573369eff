"""The launcher passes x.stride(0), x.stride(1) instead of the flattened x2's: right only for a 2-D x."""
EXERCISE = "7.5"


def int4_linear(x: Tensor, packed: Tensor, scale: Tensor, zero: Tensor, bias: Tensor | None) -> Tensor:
    k = x.shape[-1]
    n, groups = scale.shape
    if packed.shape != (n, (k + 1) // 2) or zero.shape != scale.shape or groups < 1 or k % groups:
        raise ValueError("int4_linear: packed [out, ceil(in / 2)], scale and zero [out, groups dividing in]")
    check_device(x, packed, scale, zero, bias)
    x2 = x.reshape(-1, k)
    m = x2.shape[0]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(m, 16), triton.cdiv(n, 32))
    int4_matmul_kernel[grid](x2, packed, scale, zero, bias if bias is not None else scale, y, m, n, k, k // groups,
                             x.stride(0), x.stride(1), packed.stride(0), scale.stride(0), zero.stride(0),
                             y.stride(0), y.stride(1), HAS_BIAS=bias is not None, BLOCK_M=16, BLOCK_N=32, BLOCK_K=32)
    return y.view(*x.shape[:-1], n)
