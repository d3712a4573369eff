"""The baseline KV cache: each sequence reserves its maximum length (prompt + max_tokens) up front.

Simple and fast to index, but wasteful: memory for tokens that may never be generated is held for
the whole request, which is exactly what paged attention (cache/paged.py) fixes.
"""
import torch

from minillm.engine.sequence import Sequence
from minillm.layers.attention import AttentionContext, causal_attention
from minillm.models.config import ModelConfig


class ContiguousKVCache:
    """One sequence's keys and values for every layer: [layers, max_len, kv_heads, head_dim] each."""

    def __init__(self, cfg: ModelConfig, max_len: int, dtype: torch.dtype, device: torch.device) -> None:
        shape = (cfg.num_hidden_layers, max_len, cfg.num_key_value_heads, cfg.head_dim)
        self.k = torch.empty(shape, dtype=dtype, device=device)
        self.v = torch.empty(shape, dtype=dtype, device=device)

    @property
    def max_len(self) -> int:
        return self.k.shape[1]

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def store(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write the K/V of positions start .. start + len(k) - 1."""
        self.k[layer, start:start + k.shape[0]] = k
        self.v[layer, start:start + v.shape[0]] = v

    def view(self, layer: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K/V of positions 0 .. end - 1: [end, kv_heads, head_dim] each (views, no copy)."""
        return self.k[layer, :end], self.v[layer, :end]


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
    """Gives each admitted sequence its own max-length cache and takes it back when it ends."""

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, device: torch.device) -> None:
        self.cfg, self.dtype, self.device = cfg, dtype, device
        self.reserved_bytes = 0

    def allocate(self, seq: Sequence) -> None:
        seq.kv_cache = ContiguousKVCache(self.cfg, seq.num_prompt_tokens + seq.params.max_tokens,
                                         self.dtype, self.device)
        self.reserved_bytes += seq.kv_cache.nbytes

    def free(self, seq: Sequence) -> None:
        if seq.kv_cache is not None:
            self.reserved_bytes -= seq.kv_cache.nbytes
            seq.kv_cache = None

    def context(self, seqs: list[Sequence], query_lens: list[int]) -> ContiguousContext:
        return ContiguousContext([s.kv_cache for s in seqs], query_lens, [s.num_computed_tokens for s in seqs])
