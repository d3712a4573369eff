"""The baseline KV cache: each sequence reserves its maximum length (prompt + max_tokens) up front.

Simple and fast to index, but wasteful: memory for tokens that may never be generated is held for
the whole request, which is exactly what paged attention (cache/paged.py) fixes.
"""
import torch

from minillm.config import CacheKind
from minillm.layers.attention import AttentionContext, causal_attention
from minillm.models.model_config import ModelConfig
from minillm.sequence import Sequence
from minillm.step import KVStats, ScheduledSeq


class ContiguousKVCache:
    """One sequence's keys and values for every layer: [layers, kv_heads, max_len, head_dim] each.

    Head-major, so each head's keys are one contiguous [len, head_dim] matrix: decode attention
    then reads them with a plain batched matmul instead of a strided gather.
    """

    def __init__(self, cfg: ModelConfig, max_len: int, dtype: torch.dtype, device: torch.device) -> None:
        shape = (cfg.num_hidden_layers, cfg.num_key_value_heads, max_len, cfg.head_dim)
        self.k = torch.empty(shape, dtype=dtype, device=device)
        self.v = torch.empty(shape, dtype=dtype, device=device)

    @property
    def max_len(self) -> int:
        return self.k.shape[2]

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def store(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write the K/V of positions start .. start + n - 1; k, v: [n, kv_heads, head_dim]."""
        self.k[layer, :, start:start + k.shape[0]] = k.transpose(0, 1)
        self.v[layer, :, start:start + v.shape[0]] = v.transpose(0, 1)

    def view(self, layer: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K/V of positions 0 .. end - 1 as [end, kv_heads, head_dim] views (no copy)."""
        return self.k[layer, :, :end].transpose(0, 1), self.v[layer, :, :end].transpose(0, 1)


class ContiguousContext(AttentionContext):
    """A step's batch over contiguous caches: sequence i brings query_lens[i] new tokens, after
    context_lens[i] tokens that are already cached."""

    def __init__(self, caches: list[ContiguousKVCache], query_lens: list[int], context_lens: list[int]) -> None:
        self.caches, self.query_lens, self.context_lens = caches, query_lens, context_lens

    def attend(self, layer_idx, q, k, v):
        outs, start = [], 0
        for cache, n, cached in zip(self.caches, self.query_lens, self.context_lens):
            end = start + n
            cache.store(layer_idx, cached, k[start:end], v[start:end])
            keys, values = cache.view(layer_idx, cached + n)
            outs.append(causal_attention(q[start:end], keys, values))
            start = end
        return outs[0] if len(outs) == 1 else torch.cat(outs)


class ContiguousCacheManager:
    """Gives each admitted sequence its own max-length cache (seq.kv) and takes it back when it ends."""
    kind = CacheKind.CONTIGUOUS
    num_blocks = None  # no fixed pool: each cache comes from the process's memory

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, device: torch.device) -> None:
        self.cfg, self.dtype, self.device = cfg, dtype, device
        self.reserved_bytes = 0

    def fits(self, prompt_len: int, total_len: int, n: int) -> bool:
        return True

    def allocate(self, seq: Sequence) -> int:
        seq.kv = ContiguousKVCache(self.cfg, seq.num_prompt_tokens + seq.params.max_tokens, self.dtype, self.device)
        self.reserved_bytes += seq.kv.nbytes
        return 0  # nothing is shared, so nothing is found already computed

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """A parallel sample gets its own full-length copy: contiguous caches cannot share."""
        self.allocate(child)
        n = parent.num_computed_tokens
        child.kv.k[:, :, :n] = parent.kv.k[:, :, :n]
        child.kv.v[:, :, :n] = parent.kv.v[:, :, :n]

    def reserve(self, seq: Sequence, num_new_tokens: int) -> bool:
        return True  # everything was reserved up front

    def holds(self, seq: Sequence, num_tokens: int) -> bool:
        return seq.kv is not None and seq.kv.max_len >= num_tokens

    def trim(self, seq: Sequence) -> None:
        pass  # the reservation is the sequence's whole length; rejected slots are simply written again

    def computed(self, seq: Sequence) -> None:
        pass

    def free(self, seq: Sequence) -> None:
        if seq.kv is not None:
            self.reserved_bytes -= seq.kv.nbytes
            seq.kv = None

    def block_table(self, seq: Sequence) -> list[int]:
        return []

    def context(self, batch: list[ScheduledSeq]) -> ContiguousContext:
        return ContiguousContext([b.seq.kv for b in batch], [b.num_tokens for b in batch],
                                 [b.seq.num_computed_tokens for b in batch])

    def stats(self, seqs: list[Sequence]) -> KVStats:
        """Each sequence is one 'block' of its reserved length; fragmentation is reserved-but-empty."""
        held = [s for s in seqs if s.kv is not None]
        reserved = sum(s.kv.max_len for s in held)
        computed = sum(s.num_computed_tokens for s in held)
        return KVStats(kind=self.kind, total_blocks=len(held), used_blocks=len(held), cached_blocks=0,
                       free_blocks=0, block_size=0, bytes_per_block=0, used_bytes=self.reserved_bytes,
                       fragmentation=1 - computed / reserved if reserved else 0.0, prefix_hit_rate=0.0,
                       blocks_per_request={s.request_id: 1 for s in held}, block_owner=[s.request_id for s in held])
