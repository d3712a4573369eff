"""Even inputs are read from the high nibble, odd ones from the low one."""
EXERCISE = "7.5"


@triton.jit
def int4_matmul_kernel(x_ptr, q_ptr, s_ptr, z_ptr, b_ptr, y_ptr, M, N, K, group_size,
                       stride_xm, stride_xk, stride_qn, stride_sn, stride_zn, stride_ym, stride_yn,
                       HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """One program per [BLOCK_M, BLOCK_N] tile of y = x @ dequant(W)^T + b, W dequantized a tile at a time."""
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] rows of x and y
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N] output features: rows of W
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)  # [BLOCK_K] input features
        x = tl.load(x_ptr + rm[:, None] * stride_xm + rk[None, :] * stride_xk,
                    mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)  # [BLOCK_M, BLOCK_K]
        w_mask = (rn[:, None] < N) & (rk[None, :] < K)  # [BLOCK_N, BLOCK_K]
        byte = tl.load(q_ptr + rn[:, None] * stride_qn + (rk // 2)[None, :], mask=w_mask, other=0).to(tl.int32)
        code = (byte >> ((1 - rk % 2) * 4)[None, :]) & 0xF  # even k: the low nibble, odd k: the high one
        group = (rk // group_size)[None, :]
        scale = tl.load(s_ptr + rn[:, None] * stride_sn + group, mask=w_mask, other=0.0)
        zero = tl.load(z_ptr + rn[:, None] * stride_zn + group, mask=w_mask, other=0).to(tl.float32)
        w = (code.to(tl.float32) - zero) * scale  # [BLOCK_N, BLOCK_K]: the dequantized tile, in registers
        acc = tl.dot(x, tl.trans(w.to(x.dtype)), acc, input_precision="ieee")
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :] * stride_yn, acc.to(y_ptr.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))
