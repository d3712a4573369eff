"""Leaves a reused block among the evictable ones, so a block in use can be evicted."""
EXERCISE = "3.6"


class EvictableBlocks(EvictableBlocks):
    def reuse(self, block):
        pass
