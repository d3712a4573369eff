"""Takes blocks one by one and gives up when the pool runs dry, without returning those it took."""
EXERCISE = "3.1"


class BlockAllocator(BlockAllocator):
    def allocate(self, num_tokens):
        table = []
        for _ in range(self.blocks_for(num_tokens)):
            if not self.free_blocks:
                return None
            table.append(self.free_blocks.popleft())
            self.ref_counts[table[-1]] = 1
        return table
