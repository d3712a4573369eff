"""The launcher passes the number of groups where the kernel takes the group size."""
EXERCISE = "7.5"


def int4_linear(x: Tensor, packed: Tensor, scale: Tensor, zero: Tensor, bias: Tensor | None) -> Tensor:
    """y = x @ W^T + bias on int4_matmul_kernel, W in the engine's packed int4 format (lab 06's int4_linear).

    x: [..., in]; packed: uint8 [out, ceil(in / 2)]; scale: float32 [out, groups]; zero: uint8
    [out, groups] (groups divides in; group_size = in // groups); bias: [out] or None -> [..., out] in x's dtype.
    Tiles: BLOCK_M = 16, BLOCK_N = BLOCK_K = 32; grid (ceil(rows / 16), ceil(out / 32)).

    Hints: kernel about 18 lines: 7.4's, with the tile of W built from a byte load, a shift by
    (rk % 2) * 4, & 0xF, and the loads of each lane's scale and zero at group rk // group_size; the
    bias added to acc under `if HAS_BIAS:`. Launcher 3 lines: the grid and the launch (when there is
    no bias, pass any tensor as b_ptr: HAS_BIAS=False never reads it).
    """
    k = x.shape[-1]
    n, groups = scale.shape
    if packed.shape != (n, (k + 1) // 2) or zero.shape != scale.shape or groups < 1 or k % groups:
        raise ValueError(f"int4_linear: x [..., {k}] needs packed [out, {(k + 1) // 2}] and scale, zero [out, groups] "
                         f"with groups dividing {k}; got packed {tuple(packed.shape)}, scale {tuple(scale.shape)}, "
                         f"zero {tuple(zero.shape)}")
    check_device(x, packed, scale, zero, bias)
    x2 = x.reshape(-1, k)  # [M, in]
    m = x2.shape[0]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)  # [M, out]
    grid = (triton.cdiv(m, 16), triton.cdiv(n, 32))
    int4_matmul_kernel[grid](x2, packed, scale, zero, bias if bias is not None else scale, y, m, n, k, groups,
                             x2.stride(0), x2.stride(1), packed.stride(0), scale.stride(0), zero.stride(0),
                             y.stride(0), y.stride(1), HAS_BIAS=bias is not None, BLOCK_M=16, BLOCK_N=32, BLOCK_K=32)
    return y.view(*x.shape[:-1], n)
