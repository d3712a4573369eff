"""Paged decode attention: one query token per sequence, attending over its context where it lies
in the paged pool, a tile of BLOCK_N tokens at a time, each token's slot looked up in its block table
(table[t // block_size] * block_size + t % block_size): no gather, no padding to a batch max.

Grid (sequences, kv_heads, splits). GQA-aware: one program serves every query head of one kv
head, so each K/V block is read once for the whole group (not once per query head). Online softmax
(see softmax.py) over the tiles keeps a running max m, sum denom and output acc per query head.

Flash-decoding: with few sequences a long context leaves most of a GPU idle (sequences x kv_heads
programs), so the context is split into `splits` ranges handled in parallel; each writes its partial
output (normalised by its own denom) and log-sum-exp m + log(denom), and `combine_splits_kernel` weights
parts by exp(lse_s - max lse), the exact softmax over the whole context.
"""
import torch

from minillm.arith import cdiv
from minillm.kernels.runtime import INTERPRETED, check_device, next_pow2, tl, triton
from minillm.layers.attention import decode_attention


def paged_decode_spec(q: torch.Tensor, k_slots: torch.Tensor, v_slots: torch.Tensor, block_tables: torch.Tensor,
                      context_lens: torch.Tensor, block_size: int) -> torch.Tensor:
    """q: [B, heads, d]; k_slots, v_slots: [slots, kv_heads, d]; block_tables: [B, max_blocks];
    context_lens: [B] -> [B, heads, d]. Sequence b's token t lies in slot table[b, t // bs] * bs + t % bs."""
    out = torch.empty_like(q)
    for b, length in enumerate(context_lens.tolist()):
        t = torch.arange(length, device=q.device)
        slots = block_tables[b, t // block_size].long() * block_size + t % block_size  # [length]
        out[b] = decode_attention(q[b:b + 1], k_slots[slots][None], v_slots[slots][None])[0]
    return out


@triton.jit
def paged_decode_kernel(q_ptr, k_ptr, v_ptr, table_ptr, ctx_ptr, rows_ptr, out_ptr, lse_ptr,
                        scale, block_size, split_len, group, d,
                        stride_qt, stride_qh, stride_ks, stride_kh, stride_tb, stride_ot, stride_oh, stride_os,
                        stride_lb, stride_lh,
                        GROUP: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr):
    b, kvh, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    row = tl.load(rows_ptr + b)  # the query's row in q and out
    ctx = tl.load(ctx_ptr + b)
    first = split * split_len
    last = tl.minimum(first + split_len, ctx)  # this split's tokens; first >= last: an empty split
    g, c = tl.arange(0, GROUP), tl.arange(0, D)
    heads = kvh * group + g  # [GROUP] the query heads of this kv head
    head_mask, d_mask = g < group, c < d
    q = tl.load(q_ptr + row * stride_qt + heads[:, None] * stride_qh + c[None, :],
                mask=head_mask[:, None] & d_mask[None, :], other=0.0).to(tl.float32) * scale  # [GROUP, D]
    m = tl.full((GROUP,), -float("inf"), tl.float32)
    denom = tl.zeros((GROUP,), tl.float32)
    acc = tl.zeros((GROUP, D), tl.float32)
    for n0 in range(first, last, BLOCK_N):
        t = n0 + tl.arange(0, BLOCK_N)  # [BLOCK_N] token positions, maybe across several blocks
        valid = t < last
        block = tl.load(table_ptr + b * stride_tb + t // block_size, mask=valid, other=0).to(tl.int64)
        slots = block * block_size + t % block_size  # where each token lies in the pool
        kv_mask = valid[:, None] & d_mask[None, :]
        k = tl.load(k_ptr + slots[:, None] * stride_ks + kvh * stride_kh + c[None, :], mask=kv_mask, other=0.0)
        s = tl.sum(q[:, None, :] * k.to(tl.float32)[None, :, :], axis=2)  # [GROUP, BLOCK_N]
        s = tl.where(valid[None, :], s, -float("inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))  # finite: every tile holds a token of the context
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])  # [GROUP, BLOCK_N]
        v = tl.load(v_ptr + slots[:, None] * stride_ks + kvh * stride_kh + c[None, :], mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v.to(tl.float32)[None, :, :], axis=1)  # [GROUP, D]
        denom = denom * alpha + tl.sum(p, axis=1)
        m = m_new
    denom = tl.where(denom > 0, denom, 1.0)  # an empty split (not stored) stays finite
    out = acc / denom[:, None]
    stored = g < tl.where(first < last, group, 0)  # [GROUP]: nothing from an empty split
    store_mask = stored[:, None] & d_mask[None, :]
    if SPLIT:  # a partial result: [B, heads, splits, d] and its log-sum-exp [B, heads, splits]
        tl.store(out_ptr + b * stride_ot + heads[:, None] * stride_oh + split * stride_os + c[None, :], out,
                 mask=store_mask)
        tl.store(lse_ptr + b * stride_lb + heads * stride_lh + split, m + tl.log(denom), mask=stored)
    else:
        tl.store(out_ptr + row * stride_ot + heads[:, None] * stride_oh + c[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=store_mask)


@triton.jit
def combine_splits_kernel(part_ptr, lse_ptr, ctx_ptr, rows_ptr, out_ptr, split_len, d,
                          stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_ot, stride_oh,
                          SPLITS: tl.constexpr, D: tl.constexpr):
    b, h = tl.program_id(0), tl.program_id(1)
    used = tl.cdiv(tl.load(ctx_ptr + b), split_len)  # this sequence's non-empty splits
    s, c = tl.arange(0, SPLITS), tl.arange(0, D)
    lse = tl.load(lse_ptr + b * stride_lb + h * stride_lh + s, mask=s < used, other=-float("inf"))  # [SPLITS]
    w = tl.exp(lse - tl.max(lse, axis=0))  # each part's share of the softmax's denominator
    part = tl.load(part_ptr + b * stride_pb + h * stride_ph + s[:, None] * stride_ps + c[None, :],
                   mask=(s[:, None] < used) & (c[None, :] < d), other=0.0)  # [SPLITS, D]
    out = tl.sum(w[:, None] * part, axis=0) / tl.sum(w, axis=0)
    row = tl.load(rows_ptr + b)
    tl.store(out_ptr + row * stride_ot + h * stride_oh + c, out.to(out_ptr.dtype.element_ty), mask=c < d)


BLOCK_N = 64 if INTERPRETED else 32  # tokens per step of the loop (the interpreter pays per step, not per token)


def choose_splits(batch: int, kv_heads: int, max_context: int, device: torch.device) -> int:
    """Enough programs to fill the GPU (about two per multiprocessor), never a split under 256 tokens."""
    if INTERPRETED or device.type != "cuda":
        return 1  # the interpreter runs programs one by one: more of them only costs time
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return max(1, min(cdiv(2 * sms, batch * kv_heads), max_context // 256))


def paged_decode_attention(q: torch.Tensor, k_slots: torch.Tensor, v_slots: torch.Tensor, block_tables: torch.Tensor,
                           context_lens: torch.Tensor, block_size: int, max_context: int | None = None,
                           rows: torch.Tensor | None = None, out: torch.Tensor | None = None,
                           splits: int | None = None) -> torch.Tensor:
    """q: [tokens, heads, d]; k_slots, v_slots: [slots, kv_heads, d] (one pool layer, read in place);
    block_tables: int [B, max_blocks]; context_lens: int [B]; rows: int [B], the q row of each sequence
    (None: rows 0..B-1); out: [tokens, heads, d] to write those rows of (None: a new one).
    max_context: the longest context (None: read from context_lens, a device sync). -> out."""
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
    if q.stride(2) != 1:
        q = q.contiguous()
    if rows is None:
        rows = torch.arange(batch, dtype=torch.int32, device=q.device)
    out = torch.empty_like(q) if out is None else out
    if batch == 0:
        return out
    max_context = int(context_lens.max()) if max_context is None else max_context
    tiles = cdiv(max_context, BLOCK_N)
    splits = choose_splits(batch, kv_heads, max_context, q.device) if splits is None else splits
    split_len = cdiv(tiles, max(1, min(splits, tiles))) * BLOCK_N  # whole tiles per split
    splits = cdiv(max_context, split_len)  # no split left empty for the longest sequence
    group, scale = heads // kv_heads, d ** -0.5
    shapes = dict(GROUP=next_pow2(group), D=next_pow2(d), BLOCK_N=BLOCK_N)
    common = (scale, block_size, split_len, group, d, q.stride(0), q.stride(1), k_slots.stride(0), k_slots.stride(1),
              block_tables.stride(0))
    grid = (batch, kv_heads, splits)
    if splits == 1:
        paged_decode_kernel[grid](q, k_slots, v_slots, block_tables, context_lens, rows, out, out, *common,
                                  out.stride(0), out.stride(1), 0, 0, 0, SPLIT=False, **shapes)
        return out
    part = torch.empty(batch, heads, splits, d, dtype=torch.float32, device=q.device)  # [B, heads, splits, d]
    lse = torch.empty(batch, heads, splits, dtype=torch.float32, device=q.device)      # [B, heads, splits]
    paged_decode_kernel[grid](q, k_slots, v_slots, block_tables, context_lens, rows, part, lse, *common,
                              *part.stride()[:3], *lse.stride()[:2], SPLIT=True, **shapes)
    combine_splits_kernel[(batch, heads)](part, lse, context_lens, rows, out, split_len, d,
                                          *part.stride()[:3], *lse.stride()[:2], out.stride(0), out.stride(1),
                                          SPLITS=next_pow2(splits), D=shapes["D"])
    return out
