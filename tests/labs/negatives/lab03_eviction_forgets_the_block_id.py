"""Removes the cache entry keyed by the block id instead of the block's name, leaving a stale name behind."""
EXERCISE = "3.6"


class EvictableBlocks(EvictableBlocks):
    def evict(self, cache):
        block, _ = self.entries.popitem(last=False)
        cache.pop(block, None)
        return block
