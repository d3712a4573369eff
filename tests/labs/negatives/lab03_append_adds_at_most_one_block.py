"""Adds one block when the table is full, even when the new tokens need several."""
EXERCISE = "3.1"


class BlockAllocator(BlockAllocator):
    def append(self, table, num_tokens):
        if num_tokens <= len(table) * self.block_size:
            return True
        if not self.free_blocks:
            return False
        b = self.free_blocks.popleft()
        self.ref_counts[b] = 1
        table.append(b)
        return True
