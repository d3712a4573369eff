"""The BlockManager: blocks for sequences, from the allocator and the prefix cache together.

  * allocate: a prompt's cached prefix is shared (one more reference per hit block), the rest is
    taken from the free list;
  * append: a growing sequence gets a new block when its last one is full, and a private copy of a
    block it is about to write while others share it (copy-on-write);
  * free: a sequence lets go of its blocks;
  * register: a block full of computed tokens is named in the prefix cache, which then holds a
    reference of its own, so the block outlives its sequence. A named block that no sequence holds
    is *evictable*: still findable, and taken back (least recently used first) only when the free
    list runs dry.

Invariant: a block is evictable exactly when it is named and its only holder is the prefix cache.

With a second tier attached (`tier`, an OffloadStore: cache/offload.py), a prompt's match goes on
in the tier where the pool's ends, and those blocks are restored into fresh pool blocks; evicted
named blocks are saved there first; and `offload` moves a prefix's evictable blocks out of the pool.
"""
from dataclasses import dataclass, field

from minillm.arith import cdiv
from minillm.cache.allocator import BlockAllocator
from minillm.cache.offload import OffloadStore
from minillm.cache.prefix_cache import CachedBlock, EvictableBlocks, chain_hash, match_prefix
from minillm.config import Components


@dataclass
class BlockTable:
    """A sequence's paged-cache state: its blocks, and the prefix-cache entries naming its leading
    ones (entry i names block i's content; it may be another block with the same prefix)."""
    blocks: list[int]
    named: list[CachedBlock] = field(default_factory=list)


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 components: Components | None = None) -> None:
        components = components or Components()
        self.num_blocks, self.block_size = num_blocks, block_size
        self.allocator = (components.block_allocator or BlockAllocator)(num_blocks, block_size)
        self.enable_prefix_caching = enable_prefix_caching
        self.cache: dict[int, CachedBlock] = {}  # name (chain hash) -> entry
        self.named: dict[int, CachedBlock] = {}  # block id -> the entry naming it
        self.evictable = (components.evictable_blocks or EvictableBlocks)()
        self.match_prefix = components.match_prefix or match_prefix
        self.hash_fn = components.hash_fn or chain_hash
        self.query_tokens = self.hit_tokens = self.collisions = self.evictions = 0
        self.tier: OffloadStore | None = None  # the second tier, when one is attached

    # -- accounting -------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        """Blocks a new allocation can take: free ones plus evictable ones."""
        return self.allocator.num_free + len(self.evictable)

    @property
    def num_used(self) -> int:
        """Blocks held by at least one sequence."""
        return self.num_blocks - self.num_free

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.query_tokens if self.query_tokens else 0.0

    def holders(self, block: int) -> int:
        """How many sequences hold `block` (its references, less the prefix cache's own)."""
        return self.allocator.ref_counts[block] - (block in self.named)

    # -- the operations -----------------------------------------------------------------------
    def allocate(self, token_ids: list[int]) -> BlockTable | None:
        """Blocks for a sequence's tokens, reusing its cached prefix. -> None if there is no room."""
        hits = self.match_prefix(token_ids, self.block_size, self.cache, self.hash_fn) \
            if self.enable_prefix_caching else []
        if self.tier is not None:
            hits += self._adopt_orphans(token_ids[:-1], hits)
        total = cdiv(len(token_ids), self.block_size)
        extra, missed = self._tier_hits(token_ids, hits, total - len(hits))  # tier blocks, pool blocks after them
        held = hits + [e for e in extra if e.block >= 0]  # blocks already in the pool
        needed = total - len(held)
        revived = [e for e in held if e.block in self.evictable.entries]  # they stop being evictable
        if needed > self.num_free - len(revived):
            return None
        if self.tier is not None:
            self.tier.looked_up([e.hash for e in extra if e.block < 0], missed)
        self._count_lookup(token_ids, hits + extra)
        for e in revived:
            self.evictable.reuse(e.block)
        self.allocator.fork([e.block for e in held])
        self._make_free(needed)
        fresh = self.allocator.allocate(len(token_ids) - len(held) * self.block_size)
        if fresh is None or len(fresh) != needed:
            raise RuntimeError(f"the block allocator gave {fresh!r} for {needed} blocks with "
                               f"{self.allocator.num_free} free")
        table = BlockTable([e.block for e in hits], list(hits))
        self._restore(table, extra, fresh)
        return table

    def append(self, table: BlockTable, num_tokens: int) -> tuple[int, int] | None | bool:
        """Grow the table to hold num_tokens tokens, where token num_tokens - 1 is about to be
        written. If that token's block is shared with another sequence, it is replaced by a copy
        first. -> False if there is no room (nothing changed), (src, dst) when the caller must copy
        block src's K/V into dst, else None."""
        blocks = table.blocks
        needed = cdiv(num_tokens, self.block_size) - len(blocks)
        write = (num_tokens - 1) // self.block_size
        cow = write < len(blocks) and self.allocator.ref_counts[blocks[write]] > 1
        if needed + cow > self.num_free:
            return False
        self._make_free(needed + cow)
        if not self.allocator.append(blocks, num_tokens):
            raise RuntimeError(f"the block allocator refused to grow a table with {self.allocator.num_free} "
                               f"free blocks for {needed} new ones")
        if not cow:
            return None
        src, copy = blocks[write], self.allocator.allocate(1)
        self.allocator.free([src])  # one holder fewer; the others keep it
        blocks[write] = copy[0]
        return src, copy[0]

    def trim(self, table: BlockTable, num_tokens: int) -> None:
        """Keep only the blocks that num_tokens tokens fill; the rest (grown for proposals the target
        rejected) go back to the free list, last first."""
        tail = table.blocks[cdiv(num_tokens, self.block_size):]
        if tail:
            del table.blocks[len(table.blocks) - len(tail):]
            self.allocator.free(tail[::-1])

    def fork(self, table: BlockTable) -> BlockTable:
        """A second sequence sharing every block (parallel samples of one prompt)."""
        return BlockTable(self.allocator.fork(table.blocks), list(table.named))

    def free(self, table: BlockTable) -> None:
        """The sequence lets go of its blocks. Named ones it was the last to hold become
        evictable, tail first, so that a prefix's head (likelier to be shared) is evicted last."""
        blocks = list(table.blocks)
        self.allocator.free(table.blocks)
        for b in reversed(blocks):
            if b in self.named and self.allocator.ref_counts[b] == 1 and b not in self.evictable.entries:
                self.evictable.add(self.named[b])
        table.named.clear()

    def register(self, table: BlockTable, token_ids: list[int], num_computed: int) -> None:
        """Name the table's blocks that are full of computed tokens, so later prompts find them."""
        if not self.enable_prefix_caching:
            return
        i, bs = len(table.named), self.block_size
        while (i + 1) * bs <= num_computed:
            parent = table.named[-1] if table.named else None
            tokens = tuple(token_ids[i * bs:(i + 1) * bs])
            name = self.hash_fn(None if parent is None else parent.hash, tokens)
            entry = self.cache.get(name)
            if entry is None:
                entry = CachedBlock(table.blocks[i], name, tokens, parent)
                self.cache[name] = self.named[entry.block] = entry
                self.allocator.fork([entry.block])  # the prefix cache's own reference
            elif entry.tokens != tokens or entry.parent is not parent:
                self.collisions += 1
                return  # the name is taken by another prefix: this sequence's blocks stay unnamed
            # else the same prefix is cached already (in another block): the chain goes on through it
            table.named.append(entry)
            i += 1

    def offload(self, token_ids: list[int]) -> int:
        """Save the cached blocks of this prefix to the tier, then free in the pool those no sequence
        holds, from the tail back to the first one still held. -> how many blocks were freed."""
        # match_prefix leaves the last token's block out (a prompt always computes it); an offloaded
        # prefix keeps every full block, so it is matched with one token more
        chain = self.match_prefix([*token_ids, -1], self.block_size, self.cache, self.hash_fn)
        chain += self._adopt_orphans(token_ids, chain)
        self.tier.save([_tier_record(e) for e in chain])
        freed = 0
        for entry in reversed(chain):
            if entry.block not in self.evictable.entries:
                break
            self.evictable.reuse(entry.block)
            del self.cache[entry.hash], self.named[entry.block]
            self.allocator.free([entry.block])
            freed += 1
        return freed

    # -- internals --------------------------------------------------------------------------
    def _make_free(self, n: int) -> None:
        """Evict least recently used blocks until the free list holds n (saved to the tier first, if any)."""
        evicted = []
        while self.allocator.num_free < n:
            block = self.evictable.evict(self.cache)
            evicted.append(self.named.pop(block))
            self.allocator.free([block])  # the prefix cache's reference: back to the free list
            self.evictions += 1
        if self.tier is not None and evicted:  # their K/V are still in the pool until the caller writes
            self.tier.save([_tier_record(e) for e in evicted])

    def _adopt_orphans(self, token_ids: list[int], hits: list[CachedBlock]) -> list[CachedBlock]:
        """Cached blocks that continue the match but whose parent entry is another object: their
        parent left the pool (to the tier, or evicted) and came back as a new entry, so the match,
        which checks parents by identity, stops there. When the old parent chain holds the same
        tokens all the way up, the block is the same prefix: it is relinked to the new parent.
        -> the adopted entries, in order."""
        adopted, parent, bs = [], hits[-1] if hits else None, self.block_size
        for i in range(len(hits), len(token_ids) // bs):
            tokens = tuple(token_ids[i * bs:(i + 1) * bs])
            entry = self.cache.get(self.hash_fn(None if parent is None else parent.hash, tokens))
            if entry is None or entry.tokens != tokens or not _same_prefix(entry.parent, parent):
                break
            entry.parent = parent
            adopted.append(entry)
            parent = entry
        return adopted

    def _tier_hits(self, token_ids: list[int], hits: list[CachedBlock],
                   needed: int) -> tuple[list[CachedBlock], bool]:
        """Where the pool's match ends, the blocks that continue it: from the tier (entries without a
        pool block yet, block -1), and pool blocks that follow a restored one (their parent left the
        pool before them, so the match could not reach them; they keep their block). At most
        tier.capacity - needed blocks: saving the blocks this allocation evicts (at most `needed`)
        then cannot push the tier's out before they are restored. -> (those blocks, whether the
        match stopped at a block the tier did not hold)."""
        if self.tier is None or not self.enable_prefix_caching:
            return [], False
        found, parent, bs = [], hits[-1] if hits else None, self.block_size
        for i in range(len(hits), min((len(token_ids) - 1) // bs, len(hits) + self.tier.capacity - needed)):
            tokens = tuple(token_ids[i * bs:(i + 1) * bs])
            parent_hash = None if parent is None else parent.hash
            name = self.hash_fn(parent_hash, tokens)
            pooled = self.cache.get(name)
            if pooled is not None and found and pooled.tokens == tokens and _same_prefix(pooled.parent, parent):
                parent = pooled
            elif pooled is None and self.tier.holds(name, parent_hash, tokens):
                parent = CachedBlock(-1, name, tokens, parent)
            else:
                return found, pooled is None
            found.append(parent)
        return found, False

    def _restore(self, table: BlockTable, extra: list[CachedBlock], fresh: list[int]) -> None:
        """Lay out the table after its pool hits: each of `extra` in order (a tier block copied into the
        next fresh block and named as register would; a pool block relinked to the entry before it),
        then the rest of the fresh blocks."""
        fresh = iter(fresh)
        restored = []
        for entry in extra:
            if entry.block < 0:
                entry.block = next(fresh)
                self.cache[entry.hash] = self.named[entry.block] = entry
                self.allocator.fork([entry.block])  # the prefix cache's own reference
                restored.append(entry)
            else:
                entry.parent = table.named[-1]
            table.blocks.append(entry.block)
            table.named.append(entry)
        table.blocks.extend(fresh)
        if restored:
            self.tier.restore([e.hash for e in restored], [e.block for e in restored])

    def _count_lookup(self, token_ids: list[int], hits: list[CachedBlock]) -> None:
        """Hit-rate counters, and a collision when the next block's name is cached but did not match."""
        self.query_tokens += len(token_ids)
        self.hit_tokens += len(hits) * self.block_size
        i, bs = len(hits), self.block_size
        if self.enable_prefix_caching and (i + 1) * bs < len(token_ids):
            name = self.hash_fn(hits[-1].hash if hits else None, tuple(token_ids[i * bs:(i + 1) * bs]))
            self.collisions += name in self.cache


def _same_prefix(a: CachedBlock | None, b: CachedBlock | None) -> bool:
    """Do the chains ending at a and b hold the same tokens block by block (down to a shared entry)?"""
    while a is not b:
        if a is None or b is None or a.tokens != b.tokens:
            return False
        a, b = a.parent, b.parent
    return True


def _tier_record(entry: CachedBlock) -> tuple[int, int, int | None, tuple[int, ...]]:
    """What the tier keeps of a cached block: (pool block, name, parent's name, tokens)."""
    return entry.block, entry.hash, None if entry.parent is None else entry.parent.hash, entry.tokens
