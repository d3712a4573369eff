"""Allocates only while a block would stay free afterwards: the pool's last free block is never handed out."""
EXERCISE = "3.1"


class BlockAllocator(BlockAllocator):
    def allocate(self, num_tokens):
        needed = self.blocks_for(num_tokens)
        if needed >= self.num_free:
            return None
        table = [self.free_blocks.popleft() for _ in range(needed)]
        for b in table:
            self.ref_counts[b] = 1
        return table
