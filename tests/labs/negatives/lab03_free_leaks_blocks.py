"""Drops the reference counts on free but never puts the blocks back on the free list."""
EXERCISE = "3.1"


class BlockAllocator(BlockAllocator):
    def free(self, table):
        for b in table:
            self.ref_counts[b] -= 1
        table.clear()
