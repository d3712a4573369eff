"""Returns every block of a freed table to the free list, even one another table still shares."""
EXERCISE = "3.1"


class BlockAllocator(BlockAllocator):
    def free(self, table):
        for b in table:
            self.ref_counts[b] = max(0, self.ref_counts[b] - 1)
            self.free_blocks.append(b)
        table.clear()
