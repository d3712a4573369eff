"""The router's guess at what one replica's prefix cache holds, without asking the replica.

The engine names each full KV block by a hash chain of its tokens (cache/prefix_cache.py): the name of
block i stands for every token up to the end of block i. The router computes the same names for
every prompt it sends to a replica and remembers them; a new prompt's estimated hit is then

    cached_tokens = block_size * (the longest run of its leading block names the replica was sent)

which is what SGLang's router keeps in its radix tree. It is an estimate: the replica may have
evicted blocks the router still remembers, or (after a restart) hold nothing at all. The index is
bounded: past `capacity` names the least recently used are forgotten.
"""
from collections import OrderedDict

from minillm.cache.prefix_cache import block_hashes


class PrefixIndex:
    def __init__(self, block_size: int = 16, capacity: int = 65_536) -> None:
        if block_size < 1 or capacity < 1:
            raise ValueError(f"block_size and capacity must be >= 1, got block_size={block_size}, capacity={capacity}")
        self.block_size, self.capacity = block_size, capacity
        self._names: OrderedDict[int, None] = OrderedDict()  # block name -> nothing; order: least recent first

    def __len__(self) -> int:
        return len(self._names)

    def match(self, token_ids: list[int]) -> int:
        """Prompt tokens the replica should find cached. As in the engine, only blocks before the
        prompt's last token count: that token is always computed, for its logits."""
        run = 0
        for name in block_hashes(token_ids[:-1], self.block_size):
            if name not in self._names:
                break
            run += 1
        return run * self.block_size

    def insert(self, token_ids: list[int]) -> None:
        """Remember the full blocks of a prompt sent to the replica (they are cached once prefilled)."""
        # touched last block first, so a chain's first blocks are the most recent: eviction takes
        # leaves before the shared roots (a chain missing its root could never match again)
        for name in reversed(block_hashes(token_ids, self.block_size)):
            self._names[name] = None
            self._names.move_to_end(name)
        while len(self._names) > self.capacity:
            self._names.popitem(last=False)

    def clear(self) -> None:
        """The replica restarted or died: whatever it held is gone."""
        self._names.clear()
