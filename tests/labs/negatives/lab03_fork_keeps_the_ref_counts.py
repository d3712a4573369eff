"""Copies the table on fork without counting the new holder, so freeing either table frees the shared blocks."""
EXERCISE = "3.1"


class BlockAllocator(BlockAllocator):
    def fork(self, table):
        return list(table)
