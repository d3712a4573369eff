"""Counts the new holder but hands back the very list it was given, so the two samples share the same list object:
an append to one grows the other's table."""
EXERCISE = "3.1"


class BlockAllocator(BlockAllocator):
    def fork(self, table):
        for b in table:
            self.ref_counts[b] += 1
        return table
