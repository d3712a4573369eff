"""Grows a table only while a block would stay free afterwards: the pool's last free block is never handed out."""
EXERCISE = "3.1"


class BlockAllocator(BlockAllocator):
    def append(self, table, num_tokens):
        needed = self.blocks_for(num_tokens) - len(table)
        if needed > 0 and needed >= self.num_free:
            return False
        for _ in range(needed):
            b = self.free_blocks.popleft()
            self.ref_counts[b] = 1
            table.append(b)
        return True
