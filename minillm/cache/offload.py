"""KV offload: a second tier of KV blocks outside the pool, found again by their prefix-cache names.

An agent calls the model, waits seconds for a tool, then calls again with the same prompt grown
by the output and the tool's result. With prefix caching the next call reuses the previous call's
blocks, if they are still in the pool; under pressure other requests evict them and the whole
prefix is recomputed. The second tier keeps them: while the agent waits its blocks move out of the
pool (host memory beside a GPU, a memory-mapped file on a CPU) and come back on its next call,
copied into fresh pool blocks, which costs a copy instead of a prefill.

A block is keyed by its chain hash h_i = hash(h_{i-1}, tokens_i), which names its whole prefix,
and stored with its tokens and its parent's hash, so a hit is verified as in the pool's prefix
cache: a hash collision costs a miss, never someone else's K/V. The tier is inclusive: a block
restored to the pool keeps its copy here, so offloading the same prefix again after the next call
moves only the blocks that call added. It holds `capacity` blocks, least recently used out first.

Each slot holds one block's K and V for every layer:
    slots: [capacity, 2, layers, block_size, kv_heads, head_dim]   (index 0: K, 1: V)

KVOffload is the tier's one public handle on a paged cache (LLMEngine.kv_offload): attach a tier,
move a prefix to it, read its counters.
"""
from __future__ import annotations

import tempfile
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from minillm.config import OFFLOAD_KINDS

if TYPE_CHECKING:  # the block manager imports this module: the names are for annotations only
    from minillm.cache.block_manager import BlockManager
    from minillm.cache.pool import PagedKVPool


class KVOffload:
    """A paged cache's second tier, as its callers drive it: attach(kind, capacity) gives the pool a
    tier (prompts restore their prefix from it where the pool's match ends, evicted cached blocks
    are saved to it), offload_prefix moves a prefix there, stats reads its counters."""
    def __init__(self, blocks: BlockManager, pool: PagedKVPool) -> None:
        self._blocks, self._pool = blocks, pool

    def attach(self, kind: str, capacity: int, directory: str | None = None) -> None:
        """A tier of `capacity` blocks: "host" (CPU memory) or "disk" (a file in `directory`)."""
        self._blocks.tier = OffloadStore(self._pool, kind, capacity, directory)

    def offload_prefix(self, token_ids: list[int]) -> int:
        """Move the pool's cached blocks of this prefix to the tier (an agent waiting on a tool): its
        next call restores them. -> blocks freed in the pool."""
        if self._blocks.tier is None:
            raise ValueError("this paged cache has no offload tier: call kv_offload.attach(kind, capacity) first")
        return self._blocks.offload(token_ids)

    def stats(self) -> dict | None:
        """The tier's blocks, bytes, offloads, restores, misses and seconds moving; None without one."""
        return None if self._blocks.tier is None else self._blocks.tier.stats()


@dataclass
class TierEntry:
    slot: int                    # where its K/V sit in the store
    parent: int | None           # the chain hash of the block before it (None for a first block)
    tokens: tuple[int, ...]      # the block's token ids


class OffloadStore:
    """A second tier of KV blocks beside a PagedKVPool: `save` copies blocks out of the pool,
    `restore` copies them into pool blocks. kind: "host" (CPU tensors, pinned when the pool is on
    CUDA) or "disk" (one memory-mapped file of slots in `directory`, a temporary one if None)."""

    def __init__(self, pool, kind: str, capacity: int, directory: str | Path | None = None) -> None:
        if kind not in OFFLOAD_KINDS:
            raise ValueError(f"KV offload kind must be one of {', '.join(OFFLOAD_KINDS)}, got {kind!r}")
        if not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"KV offload capacity must be a positive number of blocks, got {capacity!r}")
        self.pool, self.kind, self.capacity = pool, kind, capacity
        layers, _, kv_heads, head_dim = pool.k.shape
        shape = (capacity, 2, layers, pool.block_size, kv_heads, head_dim)
        if kind == "host":
            self.slots = torch.empty(shape, dtype=pool.k.dtype, pin_memory=pool.k.is_cuda)
        else:
            self._tempdir = tempfile.TemporaryDirectory(prefix="minillm-kv-") if directory is None else None
            folder = Path(directory if directory is not None else self._tempdir.name)
            folder.mkdir(parents=True, exist_ok=True)
            self.path = folder / f"kv-{id(self):x}.bin"
            # shared=True maps the file itself: writes land in it, reads come from it (or its cached pages)
            numel = torch.Size(shape).numel()
            self.slots = torch.from_file(str(self.path), shared=True, size=numel, dtype=pool.k.dtype).view(shape)
        self.bytes_per_block = self.slots[0].numel() * self.slots.element_size()
        self.entries: OrderedDict[int, TierEntry] = OrderedDict()  # chain hash -> entry, least recent first
        self.free_slots = list(range(capacity - 1, -1, -1))
        self.offloads = self.restores = self.misses = self.evictions = self.bytes_moved = 0
        self.seconds = 0.0

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, name: int) -> bool:
        return name in self.entries

    def holds(self, name: int, parent: int | None, tokens: tuple[int, ...]) -> bool:
        """Is this block (named `name`, after `parent`, holding `tokens`) here? Changes nothing: a
        lookup counts only once the allocation it serves goes ahead (`looked_up`)."""
        entry = self.entries.get(name)
        return entry is not None and entry.parent == parent and entry.tokens == tokens

    def looked_up(self, found: list[int], missed: bool) -> None:
        """An allocation goes ahead with these blocks (names, in chain order) from here: they become the
        most recently used (about to be restored: the blocks it evicts from the pool must not push
        them out); missed: its prefix went on past them, and this tier did not hold the next block."""
        for name in found:
            self.entries.move_to_end(name)
        self.misses += missed

    def save(self, blocks: list[tuple[int, int, int | None, tuple[int, ...]]]) -> int:
        """Copy pool blocks out: each (pool block, name, parent name, tokens), a prefix's blocks in
        chain order. A name already here is only marked recently used. The chain is walked tail
        first, so its head ends most recently used: if the tier overflows, a prefix loses its tail,
        and a head without its tail still restores. -> how many blocks were copied."""
        added = []
        for block, name, parent, tokens in reversed(blocks):
            if name in self.entries:
                self.entries.move_to_end(name)
                continue
            if not self.free_slots:
                self._evict()
            self.entries[name] = TierEntry(self.free_slots.pop(), parent, tokens)
            added.append((block, name))
        # a block added and evicted again within this call (the tier is smaller than the chain) is skipped
        new = [(block, self.entries[name].slot) for block, name in added if name in self.entries]
        if new:
            start = time.perf_counter()
            k, v = self.pool.read_blocks([b for b, _ in new])  # each [layers, n, block_size, kv_heads, d]
            slots = torch.tensor([s for _, s in new])
            self.slots[slots, 0] = k.transpose(0, 1).to("cpu")
            self.slots[slots, 1] = v.transpose(0, 1).to("cpu")
            self._moved(len(new), start)
            self.offloads += len(new)
        return len(new)

    def restore(self, names: list[int], blocks: list[int]) -> None:
        """Copy the blocks named `names` (all found here) into pool blocks `blocks`, in order."""
        if not names:
            return
        start = time.perf_counter()
        slots = torch.tensor([self.entries[n].slot for n in names])
        for name in reversed(names):  # the head ends most recently used, as in save
            self.entries.move_to_end(name)
        data = self.slots[slots].to(self.pool.k.device)  # [n, 2, layers, block_size, kv_heads, d]
        self.pool.write_blocks(blocks, data[:, 0].transpose(0, 1), data[:, 1].transpose(0, 1))
        self._moved(len(names), start)
        self.restores += len(names)

    def stats(self) -> dict:
        return {"kind": self.kind, "capacity_blocks": self.capacity, "blocks": len(self.entries),
                "bytes": len(self.entries) * self.bytes_per_block, "bytes_per_block": self.bytes_per_block,
                "offloads": self.offloads, "restores": self.restores, "misses": self.misses,
                "evictions": self.evictions, "bytes_moved": self.bytes_moved, "seconds_moving": self.seconds}

    def _evict(self) -> None:
        """Drop the least recently used block to make room for a new one."""
        _, entry = self.entries.popitem(last=False)
        self.free_slots.append(entry.slot)
        self.evictions += 1

    def _moved(self, n: int, start: float) -> None:
        if self.pool.k.is_cuda:  # the copies are asynchronous on a GPU: time them to their end
            torch.cuda.synchronize(self.pool.k.device)
        self.seconds += time.perf_counter() - start
        self.bytes_moved += n * self.bytes_per_block
