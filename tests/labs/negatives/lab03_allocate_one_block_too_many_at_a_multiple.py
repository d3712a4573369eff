"""Counts the blocks of a new table as n // block_size + 1: one too many when n is an exact multiple."""
EXERCISE = "3.1"


class BlockAllocator(BlockAllocator):
    def allocate(self, num_tokens):
        needed = num_tokens // self.block_size + 1
        if needed > self.num_free:
            return None
        table = [self.free_blocks.popleft() for _ in range(needed)]
        for b in table:
            self.ref_counts[b] = 1
        return table
