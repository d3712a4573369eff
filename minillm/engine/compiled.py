"""Decode steps through torch.compile: `EngineConfig.from_knobs(compile_decode=True)`.

A decode step of a small model at batch 1 is about 600 operator calls around 120 matrix-vector
products: norms, rotary, K/V writes and gathers, attention, residual adds. Each call pays Python
and dispatcher time, and on a CPU a cold cache as well, since every layer streams megabytes of
weights through it. Compiled, the step is one program: inductor fuses the small operators into a
few C++ loops per layer, and its C++ wrapper calls them and the matmuls without coming back to
Python. Prefill and mixed steps stay eager: they are few, and their matmuls dominate.

torch.compile wants a pure function. The paged context writes K/V into the pool in place, which
compiles into a copy of the pool per layer; so the compiled step attends over each sequence's
gathered blocks with the new token's K/V put in place by `where`, returns every layer's new K/V,
and the pool takes them afterwards, in one write of K and one of V for all layers. (With
profile_attention, whose timer wraps the context, every step runs eager.)

The first decode compiles (minutes on a 2-core CPU; inductor keeps what it built in its cache
folder, so a later process with the same model shape takes under a minute), and so does the
first step with another shape of batch: more than one sequence, or rows of unequal lengths.
"""
import torch

from minillm.cache.paged import PagedContext, gather_blocks
from minillm.cache.pool import PagedKVPool
from minillm.layers.attention import AttentionContext, decode_attention

# cpp_wrapper: the compiled step calls its kernels and matmuls from C++, not from generated Python
# (on a 2-core CPU at batch 1, 0.86 -> 0.92 of the bare loop of bench decode).
INDUCTOR_OPTIONS = {"cpp_wrapper": True}


class GatheredDecode(AttentionContext):
    """The compiled step's attention: each decode row over its gathered blocks, and K/V returned
    instead of written.

    pool_k, pool_v: [layers, slots, kv_heads, d]; blocks: [B * max_blocks], the rows' block tables
    back to back (padded with the pool's zero block); length: the longest context L (the new token included);
    padding: [B, L], True past row b's context, or None when every row is L long.
    """

    def __init__(self, pool_k: torch.Tensor, pool_v: torch.Tensor, block_size: int, blocks: torch.Tensor,
                 length: int, padding: torch.Tensor | None) -> None:
        self.pools, self.block_size, self.blocks, self.padding = (pool_k, pool_v), block_size, blocks, padding
        positions = torch.arange(length, device=blocks.device)
        if padding is None:
            is_new = (positions == length - 1)[None]                     # [1, L]: every row's last position
        else:
            ends = (~padding).sum(1, keepdim=True)                       # [B, 1]: each row's context length
            is_new = positions[None] == ends - 1                         # [B, L]
        self.is_new = is_new[:, :, None, None]                           # [B or 1, L, 1, 1]
        self.length = length
        self.new_k: list[torch.Tensor] = []
        self.new_v: list[torch.Tensor] = []

    def gather(self, pool: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        """One layer's pool [slots, kv_heads, d] and the step's new K or V [B, kv_heads, d] -> [B, L, kv_heads, d]."""
        by_block = pool.view(-1, self.block_size, *new.shape[1:])
        cached = gather_blocks(by_block, self.blocks, new.shape[0], self.length)
        return torch.where(self.is_new, new[:, None], cached)

    def attend(self, layer_idx, q, k, v):
        self.new_k.append(k)
        self.new_v.append(v)
        keys, values = (self.gather(pool[layer_idx], new) for pool, new in zip(self.pools, (k, v)))
        return decode_attention(q, keys, values, self.padding)


class CompiledDecode:
    """Runs the model as the runner would (`model(input_ids, positions, ctx)`), compiled for decode-only steps."""

    def __init__(self, model: torch.nn.Module, pool: PagedKVPool) -> None:
        self.model, self.pool = model, pool
        self.compiled = torch.compile(self._decode, dynamic=True, fullgraph=True, options=INDUCTOR_OPTIONS)

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        if not (isinstance(ctx, PagedContext) and ctx.decode_only):
            return self.model(input_ids, positions, ctx)
        _, blocks, length, padding = ctx.decode_groups[0]
        hidden, k, v = self.compiled(input_ids, positions, self.pool.k, self.pool.v, blocks, length, padding)
        self.pool.k.index_copy_(1, ctx.slot_mapping, k)  # k, v: [layers, B, kv_heads, d]
        self.pool.v.index_copy_(1, ctx.slot_mapping, v)
        return hidden

    def _decode(self, input_ids, positions, pool_k, pool_v, blocks, length, padding):
        """-> hidden [B, hidden], and the step's K and V of every layer: [layers, B, kv_heads, d] each."""
        ctx = GatheredDecode(pool_k, pool_v, self.pool.block_size, blocks, length, padding)
        hidden = self.model(input_ids, positions, ctx)
        return hidden, torch.stack(ctx.new_k), torch.stack(ctx.new_v)
