"""The scores are not divided by sqrt(d)."""
EXERCISE = "7.6"


def paged_decode_attention(q: Tensor, k_slots: Tensor, v_slots: Tensor, block_tables: Tensor, context_lens: Tensor,
                           block_size: int, max_context: int | None = None, rows: Tensor | None = None,
                           out: Tensor | None = None) -> Tensor:
    """Decode attention through block tables on paged_decode_kernel (the engine's interface).

    q: [tokens, heads, d]; k_slots, v_slots: [slots, kv_heads, d], the same strides, d contiguous;
    block_tables: int [B, max_blocks]; context_lens: int [B], each >= 1; block_size: slots per block;
    max_context: the longest context (the engine passes it; one program walks a whole context, so
    it is not needed here); rows: int [B], the row of q (and out) of each sequence (None: 0..B-1);
    out: [tokens, heads, d] whose rows `rows` are written (None: a new tensor). -> out.
    out[rows[b], h] = softmax(q[rows[b], h] . K_b^T / sqrt(d)) V_b over sequence b's context,
    with K_b, V_b kv head h // (heads // kv_heads) of its tokens' slots.
    Grid (B, kv_heads); scale d ** -0.5; GROUP = next_pow2(heads // kv_heads), D = next_pow2(d).

    Hints: kernel about 30 lines, the formulas above; tl.full((GROUP,), -float("inf"), tl.float32),
    `for n0 in range(0, ctx, BLOCK_N)`, `.to(tl.int64)` on the block numbers (slot * stride can
    pass 2**31 in a large pool). Launcher 2 or 3 lines: group, then the launch with the strides
    q.stride(0), q.stride(1), k_slots.stride(0), k_slots.stride(1), block_tables.stride(0),
    out.stride(0), out.stride(1).
    """
    batch, (_, heads, d), kv_heads = block_tables.shape[0], q.shape, k_slots.shape[1]
    if heads % kv_heads or k_slots.shape[2] != d or v_slots.shape != k_slots.shape or context_lens.shape != (batch,):
        raise ValueError(f"paged_decode_attention: q [tokens, heads, d], pools [slots, kv_heads, d] with kv_heads "
                         f"dividing heads, context_lens [B]; got q {tuple(q.shape)}, pools {tuple(k_slots.shape)} "
                         f"and {tuple(v_slots.shape)}, block_tables {tuple(block_tables.shape)}, "
                         f"context_lens {tuple(context_lens.shape)}")
    if k_slots.stride() != v_slots.stride() or k_slots.stride(2) != 1:
        raise ValueError(f"paged_decode_attention: K and V pools need the same strides, d contiguous; got "
                         f"{k_slots.stride()} and {v_slots.stride()}")
    check_device(q, k_slots, v_slots, block_tables, context_lens, rows, out)
    q = q if q.stride(2) == 1 else q.contiguous()
    rows = torch.arange(batch, dtype=torch.int32, device=q.device) if rows is None else rows
    out = torch.empty_like(q) if out is None else out
    if batch == 0:
        return out
    group = heads // kv_heads
    paged_decode_kernel[(batch, kv_heads)](
        q, k_slots, v_slots, block_tables, context_lens, rows, out, 1.0, block_size, group, d,
        q.stride(0), q.stride(1), k_slots.stride(0), k_slots.stride(1), block_tables.stride(0),
        out.stride(0), out.stride(1), GROUP=next_pow2(group), D=next_pow2(d), BLOCK_N=BLOCK_N)
    return out
