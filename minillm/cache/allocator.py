"""The block allocator: a free list and one reference count per KV block.

The pool is cut into fixed-size blocks of `block_size` token slots (PagedAttention, Kwon et al.
2023). A sequence owns a *block table*, the list of block ids holding its tokens in order: token t
lives in block table[t // block_size] at offset t % block_size. A block's reference count is the
number of holders: block tables, and the prefix cache for a block it keeps findable. A block
nobody holds goes back to the free list. Lab 03's Exercise 3.1 builds this class; the engine runs
the learner's version through `Components.block_allocator`.
"""
from collections import deque

from minillm.arith import cdiv


class BlockAllocator:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need num_blocks >= 1 and block_size >= 1, got {num_blocks} and {block_size}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.free_blocks: deque[int] = deque(range(num_blocks))
        self.ref_counts = [0] * num_blocks

    @property
    def num_free(self) -> int:
        return len(self.free_blocks)

    def blocks_for(self, num_tokens: int) -> int:
        return cdiv(num_tokens, self.block_size)

    def allocate(self, num_tokens: int) -> list[int] | None:
        """A new table of blocks for num_tokens tokens (ref count 1 each), or None (nothing
        changed) if too few blocks are free."""
        needed = self.blocks_for(num_tokens)
        if needed > self.num_free:
            return None
        table = [self.free_blocks.popleft() for _ in range(needed)]
        for b in table:
            self.ref_counts[b] = 1
        return table

    def append(self, table: list[int], num_tokens: int) -> bool:
        """Grow `table` in place to hold num_tokens tokens. -> False (table unchanged) if too few are free."""
        needed = self.blocks_for(num_tokens) - len(table)
        if needed > self.num_free:
            return False
        for _ in range(needed):
            b = self.free_blocks.popleft()
            self.ref_counts[b] = 1
            table.append(b)
        return True

    def fork(self, table: list[int]) -> list[int]:
        """A new table sharing every block of `table`: one more reference to each."""
        for b in table:
            self.ref_counts[b] += 1
        return list(table)

    def free(self, table: list[int]) -> None:
        """Drop this table's reference to each of its blocks; empty the table."""
        for b in table:
            if self.ref_counts[b] <= 0:
                raise RuntimeError(f"block {b} freed more often than it was taken")
            self.ref_counts[b] -= 1
            if self.ref_counts[b] == 0:
                self.free_blocks.append(b)
        table.clear()
