"""The paged KV cache: one preallocated pool of blocks, read and written through block tables.

Memory is reserved once, for the whole engine, as `num_blocks` blocks of `block_size` token slots
per layer. A sequence holds only the blocks its tokens fill, so the waste is at most the unused
tail of its last block, instead of everything between its length and its maximum length.
"""
import torch

from minillm.cache.block_manager import BlockManager, BlockTable
from minillm.config import Components
from minillm.layers.attention import AttentionContext, causal_attention
from minillm.models.config import ModelConfig
from minillm.state import CacheKind, KVStats, ScheduledSeq, Sequence
from minillm.utils import cdiv


def block_bytes(cfg: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    """Bytes of K and V for one block across all layers."""
    return cfg.kv_bytes_per_token(dtype.itemsize) * block_size


class PagedKVPool:
    """k, v: [layers, num_blocks * block_size, kv_heads, head_dim]; slot = block * block_size + offset."""

    def __init__(self, cfg: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        shape = (cfg.num_hidden_layers, num_blocks * block_size, cfg.num_key_value_heads, cfg.head_dim)
        self.k = torch.empty(shape, dtype=dtype, device=device)
        self.v = torch.empty(shape, dtype=dtype, device=device)
        self.block_size = block_size

    def copy_block(self, src: int, dst: int) -> None:
        """Copy-on-write: give a sequence its own copy of a shared block, in every layer."""
        s, d, n = src * self.block_size, dst * self.block_size, self.block_size
        self.k[:, d:d + n] = self.k[:, s:s + n]
        self.v[:, d:d + n] = self.v[:, s:s + n]


class PagedContext(AttentionContext):
    """A step's batch over the paged pool.

    slot_mapping: [num_tokens] where each new token's K/V go.
    Decode rows (one new token each) are attended in groups of similar context length, so little
    is padded: each group is (rows, slots [B, max_len] in position order padded with slot 0,
    valid [B, max_len]). Prefill chunks are attended one by one: (first row, rows, context slots).
    """

    def __init__(self, pool: PagedKVPool, slot_mapping: torch.Tensor,
                 decode_groups: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
                 prefills: list[tuple[int, int, torch.Tensor]]) -> None:
        self.pool, self.slot_mapping = pool, slot_mapping
        self.decode_groups, self.prefills = decode_groups, prefills

    def attend(self, layer_idx, q, k, v):
        k_cache, v_cache = self.pool.k[layer_idx], self.pool.v[layer_idx]  # [slots, kv_heads, d]
        k_cache[self.slot_mapping] = k
        v_cache[self.slot_mapping] = v
        out = torch.empty_like(q)
        for rows, slots, valid in self.decode_groups:
            out[rows] = paged_decode(q[rows], k_cache, v_cache, slots, valid)
        for start, n, slots in self.prefills:
            # Gather this sequence's K/V through its block table: [context_len, kv_heads, d].
            out[start:start + n] = causal_attention(q[start:start + n], k_cache[slots], v_cache[slots])
        return out


def paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slots: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """q: [B, heads, d], one query per sequence, over the slots of its whole context -> [B, heads, d]."""
    b, heads, d = q.shape
    keys, values = k_cache[slots], v_cache[slots]  # [B, max_len, kv_heads, d]: the gather
    kv_heads = keys.shape[2]
    q = q.view(b, kv_heads, heads // kv_heads, d)  # query heads grouped by the kv head they share
    scores = torch.matmul(q, keys.permute(0, 2, 3, 1)) * d ** -0.5  # [B, kv_heads, group, max_len]
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    return torch.matmul(scores.softmax(-1), values.transpose(1, 2)).reshape(b, heads, d)


class PagedCacheManager:
    """Glues sequences to the BlockManager (who holds which block) and the pool (the tensors)."""
    kind = CacheKind.PAGED

    def __init__(self, cfg: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype,
                 device: torch.device, enable_prefix_caching: bool, components: Components = Components()) -> None:
        self.blocks = BlockManager(num_blocks, block_size, enable_prefix_caching, components)
        self.pool = PagedKVPool(cfg, num_blocks, block_size, dtype, device)
        self.num_blocks, self.block_size, self.device = num_blocks, block_size, device
        self.bytes_per_block = block_bytes(cfg, block_size, dtype)

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
        return len(table.named) * self.block_size

    def reserve(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Room for the sequence's next tokens (copying a shared block first if one would be written)."""
        result = self.blocks.append(seq.kv, seq.num_computed_tokens + num_new_tokens)
        if result is False:
            return False
        if result is not None:
            self.pool.copy_block(*result)
        return True

    def holds(self, seq: Sequence, num_tokens: int) -> bool:
        return seq.kv is not None and len(seq.kv.blocks) * self.block_size >= num_tokens

    def fork(self, parent: Sequence, child: Sequence) -> None:
        child.kv = self.blocks.fork(parent.kv)

    def computed(self, seq: Sequence) -> None:
        self.blocks.register(seq.kv, seq.token_ids, seq.num_computed_tokens)

    def free(self, seq: Sequence) -> None:
        if seq.kv is not None:
            self.blocks.free(seq.kv)
            seq.kv = None

    def block_table(self, seq: Sequence) -> list[int]:
        return list(seq.kv.blocks) if isinstance(seq.kv, BlockTable) else []

    def context(self, batch: list[ScheduledSeq]) -> "PagedContext":
        bs, new_slots, prefills, decodes = self.block_size, [], [], []
        row = 0
        for item in batch:
            seq, n = item.seq, item.num_tokens
            table = torch.tensor(seq.kv.blocks, dtype=torch.long)
            end = seq.num_computed_tokens + n
            slots = (table[:, None] * bs + torch.arange(bs)).flatten()[:end]  # [context_len]
            new_slots.append(slots[seq.num_computed_tokens:])
            if n == 1:
                decodes.append((row, slots))
            else:
                prefills.append((row, n, slots.to(self.device)))
            row += n
        return PagedContext(self.pool, torch.cat(new_slots).to(self.device), self._group(decodes), prefills)

    DECODE_GROUP = 8  # sequences per padded decode batch: fewer matmuls vs less padding

    def _group(self, decodes: list[tuple[int, torch.Tensor]]) -> list[tuple[torch.Tensor, ...]]:
        """Sort decode rows by context length and pad each run of DECODE_GROUP to its longest."""
        decodes = sorted(decodes, key=lambda d: len(d[1]))
        groups = []
        for i in range(0, len(decodes), self.DECODE_GROUP):
            part = decodes[i:i + self.DECODE_GROUP]
            longest = len(part[-1][1])
            slots = torch.zeros(len(part), longest, dtype=torch.long)
            valid = torch.zeros(len(part), longest, dtype=torch.bool)
            for j, (_, s) in enumerate(part):
                slots[j, :len(s)], valid[j, :len(s)] = s, True
            rows = torch.tensor([r for r, _ in part], dtype=torch.long)
            groups.append((rows.to(self.device), slots.to(self.device), valid.to(self.device)))
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
