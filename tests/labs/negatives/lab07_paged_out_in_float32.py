"""A new output is allocated as torch.empty(q.shape): float32 for a float16 model."""
EXERCISE = "7.6"


def paged_decode_attention(q: Tensor, k_slots: Tensor, v_slots: Tensor, block_tables: Tensor, context_lens: Tensor,
                           block_size: int, max_context: int | None = None, rows: Tensor | None = None,
                           out: Tensor | None = None) -> Tensor:
    batch, (_, heads, d), kv_heads = block_tables.shape[0], q.shape, k_slots.shape[1]
    check_device(q, k_slots, v_slots, block_tables, context_lens, rows, out)
    q = q if q.stride(2) == 1 else q.contiguous()
    rows = torch.arange(batch, dtype=torch.int32, device=q.device) if rows is None else rows
    out = torch.empty(q.shape, device=q.device) if out is None else out
    if batch == 0:
        return out
    group = heads // kv_heads
    paged_decode_kernel[(batch, kv_heads)](
        q, k_slots, v_slots, block_tables, context_lens, rows, out, d ** -0.5, block_size, group, d,
        q.stride(0), q.stride(1), k_slots.stride(0), k_slots.stride(1), block_tables.stride(0),
        out.stride(0), out.stride(1), GROUP=next_pow2(group), D=next_pow2(d), BLOCK_N=BLOCK_N)
    return out
