"""Evicts the most recently freed block instead of the least recently used one."""
EXERCISE = "3.6"


class EvictableBlocks(EvictableBlocks):
    def evict(self, cache):
        block, entry = self.entries.popitem(last=True)
        del cache[entry.hash]
        return block
