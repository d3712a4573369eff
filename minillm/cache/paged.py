"""The paged KV cache: one preallocated pool of blocks (pool.py), read and written through block tables.

Memory is reserved once, for the whole engine, as `num_blocks` blocks of `block_size` token slots
per layer. A sequence holds only the blocks its tokens fill, so the waste is at most the unused
tail of its last block, instead of everything between its length and its maximum length.
"""
from functools import partial

import torch

from minillm.arith import cdiv
from minillm.cache.block_manager import BlockManager, BlockTable
from minillm.cache.offload import KVOffload
from minillm.cache.pool import PagedKVPool, block_bytes
from minillm.config import CacheKind, Components
from minillm.kernels import paged_decode_cpu
from minillm.layers.attention import AttentionContext, causal_attention, decode_attention
from minillm.models.model_config import ModelConfig
from minillm.sequence import Sequence
from minillm.step import KVStats, ScheduledSeq


class PagedContext(AttentionContext):
    """A step's batch over the paged pool.

    slot_mapping: [num_tokens], where each new token's K/V go.
    Decode rows (one new token each) are attended in groups of similar context length, so little
    is padded: each group is (rows: a slice when adjacent in the batch, else an index tensor;
    blocks [B * max_blocks]: each row's block table padded with the pool's zero block; the longest
    context L; padding [B, L]: True past a row's context, or None when every row's context is L long).
    Prefill chunks are attended one by one: (first row, rows, blocks, context length).
    decode: on a CPU in float32, every decode row for the C++ kernel instead of the groups (kernels/
    paged_decode_cpu.py), which reads each row's blocks in place to its own length: (block tables
    [B, max_blocks], context lengths [B], rows [B]), int32. cpu_layers: whether a step of decode rows
    only may run each decoder layer as one C++ call (models/cpu_decode.py).
    """

    def __init__(self, pool: PagedKVPool, slot_mapping: torch.Tensor, decode_groups: list[tuple],
                 prefills: list[tuple[int, int, torch.Tensor, int]],
                 decode: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
                 cpu_layers: bool = False) -> None:
        self.pool, self.slot_mapping = pool, slot_mapping
        self.decode_groups, self.prefills, self.decode = decode_groups, prefills, decode
        self.decode_only = not prefills and len(decode_groups) == 1 and isinstance(decode_groups[0][0], slice)
        self.cpu_layers = cpu_layers and decode is not None and not prefills

    def cpu_decode_rows(self):
        return (self.slot_mapping, *self.decode, self.pool) if self.cpu_layers else None

    def attend(self, layer_idx, q, k, v):
        pool = self.pool
        k_slots, v_slots, out = pool.k_slots[layer_idx], pool.v_slots[layer_idx], None
        if self.decode is not None:  # the C++ kernel: one call stores the step's K/V and attends every decode row
            out = torch.empty(q.shape, dtype=q.dtype)
            paged_decode_cpu.store_and_launch(k, v, self.slot_mapping, q, k_slots, v_slots, *self.decode,
                                              pool.block_size, out)
            if not self.prefills:
                return out
        else:
            k_slots.index_copy_(0, self.slot_mapping, k)
            v_slots.index_copy_(0, self.slot_mapping, v)
        k_blocks, v_blocks = pool.k_blocks[layer_idx], pool.v_blocks[layer_idx]
        if self.decode_only:  # the common decode step: one group, its rows in batch order
            _, blocks, length, padding = self.decode_groups[0]
            return paged_decode(q, k_blocks, v_blocks, blocks, length, padding)
        out = torch.empty_like(q) if out is None else out
        for rows, blocks, length, padding in self.decode_groups:
            out[rows] = paged_decode(q[rows], k_blocks, v_blocks, blocks, length, padding)
        for start, n, blocks, context_len in self.prefills:
            # Gather this sequence's blocks, in table order: [context_len, kv_heads, d].
            keys = k_blocks.index_select(0, blocks).flatten(0, 1)[:context_len]
            values = v_blocks.index_select(0, blocks).flatten(0, 1)[:context_len]
            out[start:start + n] = causal_attention(q[start:start + n], keys, values)
        return out


def paged_decode(q: torch.Tensor, k_blocks: torch.Tensor, v_blocks: torch.Tensor, blocks: torch.Tensor,
                 length: int, padding: torch.Tensor | None) -> torch.Tensor:
    """q: [B, heads, d], one query per sequence, over the blocks [B * max_blocks] of contexts up to
    `length` long (whole blocks are gathered: one copy per block, not per token) -> [B, heads, d]."""
    b = q.shape[0]
    keys, values = gather_blocks(k_blocks, blocks, b, length), gather_blocks(v_blocks, blocks, b, length)
    return decode_attention(q, keys, values, padding)


def gather_blocks(by_block: torch.Tensor, blocks: torch.Tensor, b: int, length: int) -> torch.Tensor:
    """by_block: [pool blocks, block_size, kv_heads, d]; blocks: [B * max_blocks], B block tables
    back to back -> [B, length, kv_heads, d] (whole blocks copied, then cut to length)."""
    return by_block.index_select(0, blocks).view(b, -1, *by_block.shape[2:])[:, :length]


class PagedCacheManager:
    """Glues sequences to the BlockManager (who holds which block) and the pool (the tensors)."""
    kind = CacheKind.PAGED
    DECODE_GROUP = 8  # sequences per padded decode batch: fewer matmuls vs less padding
    # With the C++ decode kernel, a chunk of at most this many tokens (speculative verification, a short prompt or
    # turn) is attended as that many decode rows, each to its own position, where the K/V lie: no gather of the
    # context, and a step of such rows may run each layer as one C++ call (models/cpu_decode.py).
    SHORT_CHUNK = 16

    def __init__(self, cfg: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype,
                 device: torch.device, enable_prefix_caching: bool, components: Components | None = None,
                 attention_backend: str = "torch", decode_group: int | None = DECODE_GROUP,
                 cpu_decode: bool = True, cpu_layers: bool = True) -> None:
        """decode_group: decode rows per padded attention batch; None: every decode row of a step in one.
        cpu_decode: on a CPU in float32 with the torch backend, decode rows read the pool in place through
        the C++ kernel (kernels/paged_decode_cpu.py) where it builds; False: they gather their blocks.
        cpu_layers: with that kernel, a step of decode rows only runs each decoder layer as one C++ call
        (models/cpu_decode.py) where the model allows it."""
        self.blocks = BlockManager(num_blocks, block_size, enable_prefix_caching, components)
        self.triton_context = None
        if attention_backend == "triton":  # imported only when asked for: it imports triton
            from minillm.cache.paged_triton import TritonPagedContext
            self.triton_context = partial(TritonPagedContext, paged_decode=(components or Components()).paged_decode)
        self.pool = PagedKVPool(cfg, num_blocks, block_size, dtype, device)
        self.cpu_decode = (cpu_decode and attention_backend == "torch" and decode_group is not None
                           and paged_decode_cpu.applies(device, dtype))
        self.cpu_layers = self.cpu_decode and cpu_layers
        self.num_blocks, self.block_size, self.device = num_blocks, block_size, device
        self.bytes_per_block = block_bytes(cfg, block_size, dtype)
        self.decode_group = decode_group
        self.offload = KVOffload(self.blocks, self.pool)  # a second tier, once attached (cache/offload.py)

    def blocks_needed(self, prompt_len: int, total_len: int, n: int) -> int:
        """Most blocks a request can hold: its n samples share the prompt's full blocks."""
        shared = prompt_len // self.block_size
        return shared + n * (cdiv(total_len, self.block_size) - shared)

    def fits(self, prompt_len: int, total_len: int, n: int) -> bool:
        return self.blocks_needed(prompt_len, total_len, n) <= self.num_blocks

    def allocate(self, seq: Sequence) -> int | None:
        table = self.blocks.allocate(seq.token_ids)
        if table is None:
            return None
        seq.kv = table
        self.pool.zero_blocks(table.blocks[len(table.named):])  # the hits hold their K/V; the rest are new
        return len(table.named) * self.block_size

    def reserve(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Room for the sequence's next tokens (copying a shared block first if one would be written)."""
        held = len(seq.kv.blocks)
        result = self.blocks.append(seq.kv, seq.num_computed_tokens + num_new_tokens)
        if result is False:
            return False
        self.pool.zero_blocks(seq.kv.blocks[held:])
        if result is not None:
            self.pool.copy_block(*result)
        return True

    def holds(self, seq: Sequence, num_tokens: int) -> bool:
        return seq.kv is not None and len(seq.kv.blocks) * self.block_size >= num_tokens

    def fork(self, parent: Sequence, child: Sequence) -> None:
        child.kv = self.blocks.fork(parent.kv)

    def trim(self, seq: Sequence) -> None:
        self.blocks.trim(seq.kv, seq.num_computed_tokens)

    def computed(self, seq: Sequence) -> None:
        self.blocks.register(seq.kv, seq.token_ids, seq.num_computed_tokens)

    def free(self, seq: Sequence) -> None:
        if seq.kv is not None:
            self.blocks.free(seq.kv)
            seq.kv = None

    def block_table(self, seq: Sequence) -> list[int]:
        return list(seq.kv.blocks) if isinstance(seq.kv, BlockTable) else []

    def token_slots(self, seq: Sequence, num_tokens: int) -> torch.Tensor:
        """The pool slots of seq's first num_tokens tokens: [num_tokens], long, on the pool's device."""
        t, table = torch.arange(num_tokens), torch.tensor(self.block_table(seq), dtype=torch.long)
        return (table[t // self.block_size] * self.block_size + t % self.block_size).to(self.device)

    def copy_tokens(self, source: "PagedCacheManager", source_seq: Sequence, seq: Sequence, num_tokens: int) -> None:
        """The K/V of source_seq's first num_tokens tokens in `source` (a pool of a model with the same layers and
        shapes; its block size may differ) into seq's slots here, which seq's blocks must already hold."""
        into, out_of = self.token_slots(seq, num_tokens), source.token_slots(source_seq, num_tokens)
        self.pool.k[:, into] = source.pool.k[:, out_of]  # [layers, num_tokens, kv_heads, head_dim]
        self.pool.v[:, into] = source.pool.v[:, out_of]

    def context(self, batch: list[ScheduledSeq]) -> AttentionContext:
        """The step's slot mapping and attention groups, built in Python and moved to the device
        in a few tensors (per-token tensor ops here would cost more than the decode itself).
        With the Triton backend, the kernels' context over the same decodes and prefills."""
        bs, slots, prefills, decodes = self.block_size, [], [], []
        row = 0
        for item in batch:
            seq, n = item.seq, item.num_tokens
            start, end, table = seq.num_computed_tokens, seq.num_computed_tokens + n, seq.kv.blocks
            slots += [table[t // bs] * bs + t % bs for t in range(start, end)]
            blocks = table[:cdiv(end, bs)]
            if n == 1:
                decodes.append((row, blocks, end))
            elif self.cpu_decode and n <= self.SHORT_CHUNK:  # token j sees the context up to itself: a decode row
                decodes += [(row + j, blocks, start + j + 1) for j in range(n)]
            else:
                prefills.append((row, n, blocks, end))
            row += n
        slot_mapping = torch.tensor(slots, device=self.device)
        if self.triton_context is not None:
            return self.triton_context(self.pool, slot_mapping, decodes, prefills)
        prefills = [(row, n, torch.tensor(blocks, device=self.device), end) for row, n, blocks, end in prefills]
        if self.cpu_decode and decodes:
            rows, tables, lens = zip(*decodes)
            width = max(len(t) for t in tables)
            as_int32 = partial(torch.tensor, dtype=torch.int32)
            decode = (as_int32([t + [self.pool.pad_block] * (width - len(t)) for t in tables]), as_int32(lens),
                      as_int32(rows))
            return PagedContext(self.pool, slot_mapping, [], prefills, decode, self.cpu_layers)
        return PagedContext(self.pool, slot_mapping, self._group(decodes), prefills)

    def _group(self, decodes: list[tuple[int, list[int], int]]) -> list[tuple]:
        """Pad runs of `decode_group` decode rows to their longest context. When they are more than one
        run, rows are sorted by context length first, so that little is padded; one run keeps batch order."""
        size = self.decode_group or max(1, len(decodes))
        if len(decodes) > size:
            decodes = sorted(decodes, key=lambda d: d[2])
        groups = []
        for i in range(0, len(decodes), size):
            part = decodes[i:i + size]
            width = max(len(blocks) for _, blocks, _ in part)  # blocks of the longest context
            tables = [blocks + [self.pool.pad_block] * (width - len(blocks)) for _, blocks, _ in part]
            lengths = [length for _, _, length in part]
            longest, padding = max(lengths), None
            if min(lengths) < longest:
                ends = torch.tensor(lengths, device=self.device)[:, None]
                padding = torch.arange(longest, device=self.device) >= ends  # [B, longest]
            rows = [r for r, _, _ in part]
            if rows == list(range(rows[0], rows[0] + len(rows))):
                rows = slice(rows[0], rows[0] + len(rows))
            else:
                rows = torch.tensor(rows, device=self.device)
            groups.append((rows, torch.tensor(tables, device=self.device).flatten(), longest, padding))
        return groups

    def stats(self, seqs: list[Sequence]) -> KVStats:
        bm, bs = self.blocks, self.block_size
        owner: list[str | None] = [None] * self.num_blocks
        fill = [0] * self.num_blocks
        per_request: dict[str, int] = {}
        for b in bm.evictable.entries:
            owner[b], fill[b] = "cached", bs
        for seq in seqs:
            if seq.kv is None:
                continue
            blocks = seq.kv.blocks
            per_request[seq.request_id] = per_request.get(seq.request_id, 0) + len(blocks)
            for i, b in enumerate(blocks):
                owner[b] = seq.request_id if bm.holders(b) == 1 else "shared"
                fill[b] = max(fill[b], min(bs, max(0, seq.num_computed_tokens - i * bs)))
        used = [b for b in range(self.num_blocks) if owner[b] not in (None, "cached")]
        slots = len(used) * bs
        return KVStats(kind=self.kind, total_blocks=self.num_blocks, used_blocks=bm.num_used,
                       cached_blocks=len(bm.evictable), free_blocks=bm.allocator.num_free, block_size=bs,
                       bytes_per_block=self.bytes_per_block, used_bytes=bm.num_used * self.bytes_per_block,
                       fragmentation=1 - sum(fill[b] for b in used) / slots if slots else 0.0,
                       prefix_hit_rate=bm.hit_rate, prefix_collisions=bm.collisions,
                       blocks_per_request=per_request, block_owner=owner)
