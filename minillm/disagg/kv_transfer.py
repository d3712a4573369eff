"""KV transfer: a sequence's K/V, copied out of one paged pool into one buffer, and into another pool.

In disaggregated serving (disagg/disaggregated_llm.py) the prefill worker computes a prompt, and the decode
worker continues it. What moves between them is the prompt's KV cache: for each of its P tokens,
the key and the value of every layer. The pools of the two workers are laid out alike, but the
blocks differ (each pool hands out its own), so the sender packs the tokens into one contiguous
buffer in token order, and the receiver unpacks it into whatever blocks its pool gave:

    buffer: [2 (K, V), layers, P, kv_heads, head_dim]
    bytes   = P * layers * 2 * kv_heads * head_dim * dtype bytes   (ModelConfig.kv_bytes_per_token * P)

Only the P filled slots travel: the unfilled tail of the last block is left behind, and comes back
as the zeros the receiving pool gave its fresh blocks.
"""
import torch

from minillm.arith import cdiv
from minillm.cache.pool import PagedKVPool


def pack_kv(pool: PagedKVPool, blocks: list[int], num_tokens: int) -> torch.Tensor:
    """The K/V of a sequence's first num_tokens tokens, as one contiguous buffer. blocks: its block
    table; token t lives in blocks[t // block_size] at offset t % block_size, so the first
    cdiv(num_tokens, block_size) blocks are read. -> [2, layers, num_tokens, kv_heads, head_dim]"""
    needed = cdiv(num_tokens, pool.block_size)
    if not 0 < needed <= len(blocks):
        raise ValueError(f"{num_tokens} tokens fill {needed} blocks of {pool.block_size}, "
                         f"got a table of {len(blocks)} blocks (give 1 to {len(blocks) * pool.block_size} tokens)")
    k, v = pool.read_blocks(blocks[:needed])  # each [layers, len(blocks), block_size, kv_heads, d]
    return torch.stack([k.flatten(1, 2)[:, :num_tokens], v.flatten(1, 2)[:, :num_tokens]])


def unpack_kv(buffer: torch.Tensor, pool: PagedKVPool, blocks: list[int]) -> None:
    """The inverse of pack_kv: write buffer [2, layers, num_tokens, kv_heads, head_dim] into `blocks`
    of `pool` (cdiv(num_tokens, block_size) of them). The last block's slots past num_tokens are
    written with zeros, as a fresh block holds."""
    _, layers, num_tokens, kv_heads, head_dim = buffer.shape
    bs = pool.block_size
    if cdiv(num_tokens, bs) != len(blocks):
        raise ValueError(f"{num_tokens} tokens fill {cdiv(num_tokens, bs)} blocks of {bs}, got {len(blocks)} blocks")
    padded = buffer.new_zeros(2, layers, len(blocks) * bs, kv_heads, head_dim)
    padded[:, :, :num_tokens] = buffer
    by_block = padded.unflatten(2, (len(blocks), bs))  # [2, layers, blocks, block_size, kv_heads, d]
    pool.write_blocks(blocks, by_block[0].to(pool.k.device), by_block[1].to(pool.k.device))

