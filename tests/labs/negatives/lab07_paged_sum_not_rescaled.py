"""The running output and denominator are not rescaled when a tile raises the max."""
EXERCISE = "7.6"


@triton.jit
def paged_decode_kernel(q_ptr, k_ptr, v_ptr, table_ptr, ctx_ptr, rows_ptr, out_ptr, scale, block_size, group, d,
                        stride_qt, stride_qh, stride_ks, stride_kh, stride_tb, stride_ot, stride_oh,
                        GROUP: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr):
    """One program per (sequence, kv head): its query heads attend over the context through the block table."""
    b, kvh = tl.program_id(0), tl.program_id(1)
    row = tl.load(rows_ptr + b)  # the sequence's row in q and out
    ctx = tl.load(ctx_ptr + b)
    g, c = tl.arange(0, GROUP), tl.arange(0, D)
    heads = kvh * group + g  # [GROUP] the query heads of this kv head
    head_mask, d_mask = g < group, c < d
    q = tl.load(q_ptr + row * stride_qt + heads[:, None] * stride_qh + c[None, :],
                mask=head_mask[:, None] & d_mask[None, :], other=0.0).to(tl.float32) * scale  # [GROUP, D]
    m = tl.full((GROUP,), -float("inf"), tl.float32)
    denom = tl.zeros((GROUP,), tl.float32)
    acc = tl.zeros((GROUP, D), tl.float32)
    for n0 in range(0, ctx, BLOCK_N):
        t = n0 + tl.arange(0, BLOCK_N)  # [BLOCK_N] token positions, maybe across several blocks
        valid = t < ctx
        block = tl.load(table_ptr + b * stride_tb + t // block_size, mask=valid, other=0).to(tl.int64)
        slots = block * block_size + t % block_size  # [BLOCK_N] where each token lies in the pool
        kv_mask = valid[:, None] & d_mask[None, :]
        k = tl.load(k_ptr + slots[:, None] * stride_ks + kvh * stride_kh + c[None, :], mask=kv_mask, other=0.0)
        s = tl.sum(q[:, None, :] * k.to(tl.float32)[None, :, :], axis=2)  # [GROUP, BLOCK_N]
        s = tl.where(valid[None, :], s, -float("inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        p = tl.exp(s - m_new[:, None])  # [GROUP, BLOCK_N]
        v = tl.load(v_ptr + slots[:, None] * stride_ks + kvh * stride_kh + c[None, :], mask=kv_mask, other=0.0)
        acc = acc + tl.sum(p[:, :, None] * v.to(tl.float32)[None, :, :], axis=1)  # [GROUP, D]
        denom = denom + tl.sum(p, axis=1)
        m = m_new
    out = acc / denom[:, None]
    tl.store(out_ptr + row * stride_ot + heads[:, None] * stride_oh + c[None, :], out.to(out_ptr.dtype.element_ty),
             mask=head_mask[:, None] & d_mask[None, :])
