"""The paged cache's attention on the Triton kernels (EngineConfig.from_knobs(attention_backend="triton")).

Same pool, same slot mapping and block tables as PagedContext; what differs is how attention
reads them. The torch path gathers each sequence's blocks into contiguous K/V and pads decode rows
to groups of similar length; the kernels read every key where it lies, through the block table:
`store_kv` writes the step's K/V, `paged_decode_attention` serves the rows with one new token,
`prefill_attention` the prompt chunks (and speculative verification rows), all in one launch each.
"""
from collections.abc import Callable

import torch

from minillm.cache.pool import PagedKVPool
from minillm.kernels.paged_decode import paged_decode_attention
from minillm.kernels.prefill_attention import prefill_attention
from minillm.kernels.store_kv import store_kv
from minillm.layers.attention import AttentionContext


def padded_tables(tables: list[list[int]], device: torch.device) -> torch.Tensor:
    """Block tables as one int32 [B, longest] tensor; the padding is never read (the kernels mask it)."""
    width = max(len(t) for t in tables)
    return torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32, device=device)


class TritonPagedContext(AttentionContext):
    """decodes: [(row, blocks, context length)]; prefills: [(first row, rows, blocks, context length)].
    paged_decode: another launcher with paged_decode_attention's interface (lab 07's), None: the engine's."""

    def __init__(self, pool: PagedKVPool, slot_mapping: torch.Tensor, decodes: list[tuple[int, list[int], int]],
                 prefills: list[tuple[int, int, list[int], int]], paged_decode: Callable | None = None) -> None:
        self.pool, self.slot_mapping = pool, slot_mapping
        self.paged_decode = paged_decode or paged_decode_attention
        device, i32 = slot_mapping.device, dict(dtype=torch.int32, device=slot_mapping.device)
        self.decode = None
        if decodes:
            rows, tables, lens = zip(*decodes)
            self.decode = dict(block_tables=padded_tables(list(tables), device), context_lens=torch.tensor(lens, **i32),
                               max_context=max(lens), rows=torch.tensor(rows, **i32))
        self.prefill = None
        if prefills:
            starts, q_lens, tables, lens = zip(*prefills)
            self.prefill = dict(block_tables=padded_tables(list(tables), device), q_starts=torch.tensor(starts, **i32),
                                q_lens=torch.tensor(q_lens, **i32), context_lens=torch.tensor(lens, **i32),
                                max_q_len=max(q_lens))

    def attend(self, layer_idx, q, k, v):
        """q: [num_tokens, heads, d]; k, v: [num_tokens, kv_heads, d] -> [num_tokens, heads, d]"""
        k_slots, v_slots, block_size = self.pool.k_slots[layer_idx], self.pool.v_slots[layer_idx], self.pool.block_size
        store_kv(k, v, k_slots, v_slots, self.slot_mapping)
        out = torch.empty_like(q)
        if self.decode is not None:
            self.paged_decode(q, k_slots, v_slots, block_size=block_size, out=out, **self.decode)
        if self.prefill is not None:
            prefill_attention(q, k_slots, v_slots, block_size=block_size, out=out, **self.prefill)
        return out
