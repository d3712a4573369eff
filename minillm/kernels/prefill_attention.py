"""Prefill attention: causal FlashAttention over a flattened batch of sequences of different lengths
(varlen), reading every key and value where it lies in the paged pool, through the block table.

Sequence b's q_lens[b] new queries sit in rows q_starts[b] .. of q and are the last q_lens[b] of its
context_lens[b] tokens: the earlier ones are its prefix (cached blocks, or earlier chunks of a chunked
prefill), already in the pool, and store_kv has written the new ones. Query i of it sits at
position context_len - q_len + i and sees keys 0 .. that position.

Grid (sequences, query tiles, heads): a program takes BLOCK_M queries of one head and walks the keys
BLOCK_N at a time with the online softmax of softmax.py, stopping at its last query's position
(causal: later keys are masked for all of its queries). Both products run on tensor cores (tl.dot).
"""
import torch

from minillm.kernels.runtime import INTERPRETED, check_device, next_pow2, tl, triton
from minillm.layers.attention import causal_attention


def prefill_attention_spec(q: torch.Tensor, k_slots: torch.Tensor, v_slots: torch.Tensor, block_tables: torch.Tensor,
                           q_starts: torch.Tensor, q_lens: torch.Tensor, context_lens: torch.Tensor,
                           block_size: int) -> torch.Tensor:
    """q: [tokens, heads, d]; k_slots, v_slots: [slots, kv_heads, d]; block_tables: [B, max_blocks];
    q_starts, q_lens, context_lens: [B] -> [tokens, heads, d] (rows of no sequence are left as zeros)."""
    out = torch.zeros_like(q)
    for b, (start, n, length) in enumerate(zip(q_starts.tolist(), q_lens.tolist(), context_lens.tolist())):
        t = torch.arange(length, device=q.device)
        slots = block_tables[b, t // block_size].long() * block_size + t % block_size  # [length]
        out[start:start + n] = causal_attention(q[start:start + n], k_slots[slots], v_slots[slots])
    return out


@triton.jit
def prefill_attention_kernel(q_ptr, k_ptr, v_ptr, table_ptr, q_start_ptr, q_len_ptr, ctx_ptr, out_ptr,
                             scale, block_size, group, d, stride_qt, stride_qh, stride_ks, stride_kh, stride_tb,
                             stride_ot, stride_oh, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr):
    b, tile, h = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    q_len = tl.load(q_len_ptr + b)
    if tile * BLOCK_M < q_len:  # tiles past this sequence's queries have nothing to do
        q_start, ctx = tl.load(q_start_ptr + b), tl.load(ctx_ptr + b)
        kvh = h // group
        i = tile * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] query index within the sequence
        c = tl.arange(0, D)
        q_mask = (i[:, None] < q_len) & (c[None, :] < d)
        q = tl.load(q_ptr + (q_start + i)[:, None] * stride_qt + h * stride_qh + c[None, :], mask=q_mask, other=0.0)
        pos = ctx - q_len + i  # [BLOCK_M] absolute positions of the queries
        end = tl.minimum(ctx, ctx - q_len + (tile + 1) * BLOCK_M)  # keys past the tile's last query: all masked
        m = tl.full((BLOCK_M,), -float("inf"), tl.float32)
        denom = tl.zeros((BLOCK_M,), tl.float32)
        acc = tl.zeros((BLOCK_M, D), tl.float32)
        for n0 in range(0, end, BLOCK_N):
            t = n0 + tl.arange(0, BLOCK_N)  # [BLOCK_N] key positions
            valid = t < end
            block = tl.load(table_ptr + b * stride_tb + t // block_size, mask=valid, other=0).to(tl.int64)
            slots = block * block_size + t % block_size
            kv_mask = valid[:, None] & (c[None, :] < d)
            k = tl.load(k_ptr + slots[:, None] * stride_ks + kvh * stride_kh + c[None, :], mask=kv_mask, other=0.0)
            s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale  # [BLOCK_M, BLOCK_N]
            s = tl.where(valid[None, :] & (t[None, :] <= pos[:, None]), s, -float("inf"))
            m_new = tl.maximum(m, tl.max(s, axis=1))  # finite: key 0 is in every query's first tile
            alpha = tl.exp(m - m_new)
            p = tl.exp(s - m_new[:, None])
            v = tl.load(v_ptr + slots[:, None] * stride_ks + kvh * stride_kh + c[None, :], mask=kv_mask, other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
            denom = denom * alpha + tl.sum(p, axis=1)
            m = m_new
        tl.store(out_ptr + (q_start + i)[:, None] * stride_ot + h * stride_oh + c[None, :],
                 (acc / denom[:, None]).to(out_ptr.dtype.element_ty), mask=q_mask)


def prefill_attention(q: torch.Tensor, k_slots: torch.Tensor, v_slots: torch.Tensor, block_tables: torch.Tensor,
                      q_starts: torch.Tensor, q_lens: torch.Tensor, context_lens: torch.Tensor, block_size: int,
                      max_q_len: int | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """q: [tokens, heads, d]; k_slots, v_slots: [slots, kv_heads, d] (one pool layer, new K/V already
    stored); block_tables: int [B, max_blocks]; q_starts, q_lens, context_lens: int [B]; max_q_len: the
    longest q_len (None: read from q_lens, a device sync); out: [tokens, heads, d] whose rows of these
    sequences are written (None: a new one) -> out."""
    (_, heads, d), kv_heads, batch = q.shape, k_slots.shape[1], block_tables.shape[0]
    if heads % kv_heads or k_slots.shape[2] != d or v_slots.shape != k_slots.shape:
        raise ValueError(f"prefill_attention: q [tokens, heads, d] and pools [slots, kv_heads, d] with kv_heads "
                         f"dividing heads; got q {tuple(q.shape)}, pools {tuple(k_slots.shape)}, "
                         f"{tuple(v_slots.shape)}")
    if any(x.shape != (batch,) for x in (q_starts, q_lens, context_lens)):
        raise ValueError(f"prefill_attention: q_starts, q_lens and context_lens must be [{batch}], got "
                         f"{tuple(q_starts.shape)}, {tuple(q_lens.shape)}, {tuple(context_lens.shape)}")
    if k_slots.stride() != v_slots.stride() or k_slots.stride(2) != 1:
        raise ValueError(f"prefill_attention: K and V pools need the same strides, d contiguous; got "
                         f"{k_slots.stride()} and {v_slots.stride()}")
    check_device(q, k_slots, v_slots, block_tables, q_starts, q_lens, context_lens, out)
    if q.stride(2) != 1:
        q = q.contiguous()
    out = torch.empty_like(q) if out is None else out
    if batch == 0:
        return out
    max_q_len = int(q_lens.max()) if max_q_len is None else max_q_len
    block_m = 16 if max_q_len <= 16 else (32 if INTERPRETED else 64)  # tl.dot needs tiles of 16 or more
    grid = (batch, triton.cdiv(max_q_len, block_m), heads)
    prefill_attention_kernel[grid](q, k_slots, v_slots, block_tables, q_starts, q_lens, context_lens, out,
                                   d ** -0.5, block_size, heads // kv_heads, d, q.stride(0), q.stride(1),
                                   k_slots.stride(0), k_slots.stride(1), block_tables.stride(0),
                                   out.stride(0), out.stride(1), BLOCK_M=block_m, BLOCK_N=32 if INTERPRETED else 64,
                                   D=max(16, next_pow2(d)))
    return out
