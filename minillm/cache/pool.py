"""The paged cache's memory: one pool of KV blocks per engine, and what a block costs.

Both ways of attending over it read this pool: the torch path (PagedContext in paged.py) and the
Triton kernels (TritonPagedContext in paged_triton.py), so it lives apart from either.
"""
import torch

from minillm.models.model_config import ModelConfig


def block_bytes(cfg: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    """Bytes of K and V for one block across all layers."""
    return cfg.kv_bytes_per_token(dtype.itemsize) * block_size


class PagedKVPool:
    """k, v: [layers, (num_blocks + 1) * block_size, kv_heads, head_dim]; slot = block * block_size + offset.

    Per layer, the same memory is also viewed as slots (`k_slots[layer]`: [slots, kv_heads, d], where
    a step writes its new tokens) and as blocks (`k_blocks[layer]`: [blocks, block_size, kv_heads,
    d], from which attention gathers a sequence's blocks whole).

    Attention gathers whole blocks, so it reads the unwritten tail of a sequence's last block, and
    a padded row reads the extra block `pad_block`: masked out, but a masked NaN still poisons a
    sum. So the pad block stays zero, and a block is zeroed when it is handed out: no stale K/V
    (from a request whose values overflowed, say) can reach another request. Since no unwritten memory is
    ever read, the pool is allocated, not filled: its pages cost nothing until their blocks are first handed
    out (a pool zeroed whole took 0.13 s and 256 MiB of memory for every `LLM("tiny")` on a CPU, however few
    blocks its requests used).
    """

    def __init__(self, cfg: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        shape = (cfg.num_hidden_layers, (num_blocks + 1) * block_size, cfg.num_key_value_heads, cfg.head_dim)
        self.k = torch.empty(shape, dtype=dtype, device=device)
        self.v = torch.empty(shape, dtype=dtype, device=device)
        self.block_size, self.pad_block = block_size, num_blocks
        self.k_slots, self.v_slots = list(self.k.unbind(0)), list(self.v.unbind(0))
        by_block = (num_blocks + 1, block_size, *shape[2:])
        self.k_blocks = [layer.view(by_block) for layer in self.k_slots]
        self.v_blocks = [layer.view(by_block) for layer in self.v_slots]
        self._by_block = (self.k.view(shape[0], *by_block), self.v.view(shape[0], *by_block))
        self.zero_blocks([self.pad_block])

    def zero_blocks(self, blocks: list[int]) -> None:
        """Clear blocks about to hold a sequence's tokens, in every layer."""
        if blocks:
            index = torch.tensor(blocks, device=self.k.device)
            for pool in self._by_block:  # [layers, blocks, block_size, kv_heads, d]
                pool.index_fill_(1, index, 0)

    def read_blocks(self, blocks: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of these blocks, every layer (a copy): each [layers, len(blocks), block_size, kv_heads, d]."""
        index = torch.tensor(blocks, device=self.k.device)
        return self._by_block[0].index_select(1, index), self._by_block[1].index_select(1, index)

    def write_blocks(self, blocks: list[int], k: torch.Tensor, v: torch.Tensor) -> None:
        """The inverse of read_blocks: k, v: [layers, len(blocks), block_size, kv_heads, d]."""
        index = torch.tensor(blocks, device=self.k.device)
        self._by_block[0].index_copy_(1, index, k)
        self._by_block[1].index_copy_(1, index, v)

    def copy_block(self, src: int, dst: int) -> None:
        """Copy-on-write: give a sequence its own copy of a shared block, in every layer."""
        s, d, n = src * self.block_size, dst * self.block_size, self.block_size
        self.k[:, d:d + n] = self.k[:, s:s + n]
        self.v[:, d:d + n] = self.v[:, s:s + n]
