"""Returns a block to the free list when its count drops to 1, while another table still holds it."""
EXERCISE = "3.1"


class BlockAllocator(BlockAllocator):
    def free(self, table):
        for b in table:
            self.ref_counts[b] -= 1
            if self.ref_counts[b] <= 1 and b not in self.free_blocks:
                self.free_blocks.append(b)
        table.clear()
