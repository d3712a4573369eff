"""The BlockManager: who owns which KV block, and which blocks hold which prefix.

The KV pool is cut into fixed-size blocks of `block_size` token slots (PagedAttention, Kwon et al.
2023). A sequence owns a *block table*: the list of block ids holding its tokens in order, so
token t lives in block table[t // block_size] at offset t % block_size. Blocks are shared by
reference counting: a forked sample or a request with the same prefix points at the same block.

Prefix caching: each full block is named by a hash chain, h_i = hash(h_{i-1}, tokens of block i),
so one name stands for the whole prefix up to that block. A new prompt walks its blocks, looks
each name up, and reuses the blocks it finds (their K/V need no recomputing). A hash is not
proof: a hit also compares the block's stored tokens and the identity of its parent block, so a
collision can only cost a miss, never wrong K/V. Freed cached blocks stay findable until the pool
needs them back, least recently used first.
"""
from collections import OrderedDict, deque
from collections.abc import Callable
from itertools import count


def chain_hash(parent: int | None, tokens: tuple[int, ...]) -> int:
    return hash((parent, tokens))


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 hash_fn: Callable[[int | None, tuple[int, ...]], int] = chain_hash) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need num_blocks >= 1 and block_size >= 1, got {num_blocks} and {block_size}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.enable_prefix_caching, self.hash_fn = enable_prefix_caching, hash_fn
        self.ref_counts = [0] * num_blocks
        self.free_blocks: deque[int] = deque(range(num_blocks))   # empty, never cached
        self.evictable: OrderedDict[int, None] = OrderedDict()    # cached, unreferenced, LRU first
        self.cached: dict[int, int] = {}                          # chain hash -> block id
        self.block_hash: list[int | None] = [None] * num_blocks
        self.block_tokens: list[tuple[int, ...] | None] = [None] * num_blocks
        self.block_uid: list[int | None] = [None] * num_blocks    # never reused: names one filling
        self.parent_uid: list[int | None] = [None] * num_blocks
        self._uids = count()
        self.query_tokens = self.hit_tokens = self.collisions = self.evictions = 0

    # -- accounting -------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        """Blocks a new allocation can take: empty ones plus cached ones nobody references."""
        return len(self.free_blocks) + len(self.evictable)

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.query_tokens if self.query_tokens else 0.0

    # -- allocation -------------------------------------------------------------------------
    def allocate(self, token_ids: list[int]) -> tuple[list[int], int] | None:
        """Blocks for a prompt, reusing cached prefix blocks.
        -> (block table, number of prompt tokens whose K/V are already there), or None: no room."""
        hits = self._match_prefix(token_ids)
        needed = self.blocks_for(len(token_ids)) - len(hits)
        revived = sum(1 for b in hits if self.ref_counts[b] == 0)  # hits that stop being evictable
        if needed > self.num_free - revived:
            return None
        for b in hits:
            self._ref(b)
        self.query_tokens += len(token_ids)
        self.hit_tokens += len(hits) * self.block_size
        return hits + [self._take() for _ in range(needed)], len(hits) * self.block_size

    def _match_prefix(self, token_ids: list[int]) -> list[int]:
        hits, parent_hash, parent_uid = [], None, None
        if not self.enable_prefix_caching:
            return hits
        # Only blocks before the last token: the last one is always computed, for its logits.
        for i in range((len(token_ids) - 1) // self.block_size):
            tokens = tuple(token_ids[i * self.block_size:(i + 1) * self.block_size])
            h = self.hash_fn(parent_hash, tokens)
            b = self.cached.get(h)
            if b is None:
                break
            if self.block_tokens[b] != tokens or self.parent_uid[b] != parent_uid:
                self.collisions += 1  # same name, different content: a miss, never a wrong hit
                break
            hits.append(b)
            parent_hash, parent_uid = h, self.block_uid[b]
        return hits

    def append(self, table: list[int], num_tokens: int) -> tuple[int, int] | None | bool:
        """Grow `table` in place to hold num_tokens tokens, where token num_tokens - 1 is about to
        be written. If that token lands in a block shared with another table, the block is copied
        first (copy-on-write). -> False if there is no room (table unchanged), (src, dst) when the
        caller must copy block src's K/V into dst, else None."""
        needed = self.blocks_for(num_tokens) - len(table)
        write_block = (num_tokens - 1) // self.block_size
        cow = write_block < len(table) and self.ref_counts[table[write_block]] > 1
        if needed + cow > self.num_free:
            return False
        table.extend(self._take() for _ in range(needed))
        if cow:
            src = table[write_block]
            self.ref_counts[src] -= 1  # still >= 1: the other owners keep it
            table[write_block] = self._take()
            return src, table[write_block]
        return None

    def fork(self, table: list[int]) -> list[int]:
        """A second table sharing every block of `table` (parallel samples of one prompt)."""
        for b in table:
            self.ref_counts[b] += 1
        return list(table)

    def free(self, table: list[int]) -> None:
        """Drop one reference to each block. Freed in reverse so that a sequence's tail is
        evicted before its head: heads are the prefixes other requests are likelier to share."""
        for b in reversed(table):
            self.ref_counts[b] -= 1
            assert self.ref_counts[b] >= 0, f"block {b} freed twice"
            if self.ref_counts[b] == 0:
                if self.block_hash[b] is not None:
                    self.evictable[b] = None
                else:
                    self.free_blocks.append(b)
        table.clear()

    def register(self, table: list[int], token_ids: list[int], start_block: int, num_computed: int) -> int:
        """Name the blocks of `table` from start_block on that are full of computed tokens, so
        later prompts can find them. -> the index of the first block not (yet) registered."""
        if not self.enable_prefix_caching:
            return start_block
        i = start_block
        while (i + 1) * self.block_size <= num_computed:
            b = table[i]
            if self.block_hash[b] is None:
                parent = table[i - 1] if i else None
                if parent is not None and self.block_hash[parent] is None:
                    break  # the chain is broken (a duplicate was kept instead): stop naming
                tokens = tuple(token_ids[i * self.block_size:(i + 1) * self.block_size])
                h = self.hash_fn(None if parent is None else self.block_hash[parent], tokens)
                if h in self.cached:
                    break  # the same prefix (or a colliding one) is already cached elsewhere
                self.cached[h], self.block_hash[b], self.block_tokens[b] = b, h, tokens
                self.block_uid[b] = next(self._uids)
                self.parent_uid[b] = None if parent is None else self.block_uid[parent]
            i += 1
        return i

    # -- internals --------------------------------------------------------------------------
    def _ref(self, b: int) -> None:
        if self.ref_counts[b] == 0:
            del self.evictable[b]
        self.ref_counts[b] += 1

    def _take(self) -> int:
        """An empty block: a never-cached one if any, else evict the least recently used."""
        if self.free_blocks:
            b = self.free_blocks.popleft()
        else:
            b, _ = self.evictable.popitem(last=False)
            del self.cached[self.block_hash[b]]
            self.block_hash[b] = self.block_tokens[b] = self.block_uid[b] = self.parent_uid[b] = None
            self.evictions += 1
        self.ref_counts[b] = 1
        return b
