"""Prefix caching: name each full KV block by its whole prefix, find a prompt's cached prefix, and
keep freed named blocks findable until the pool needs them back (least recently used first).

A block's K/V depend on its own tokens and on every token before it, so a block is named by a hash
chain: h_i = hash(h_{i-1}, tokens of block i), one name standing for the whole prefix up to that
block. A hash is a name, not a proof: a hit also compares the entry's tokens and checks that its
parent is the entry matched just before (the same object), so a collision can only cost a miss,
never someone else's K/V. Lab 03 builds `block_hashes`, `match_prefix` and `EvictableBlocks`; the
engine runs the learner's versions through `Components`.
"""
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

HashFn = Callable[[int | None, tuple[int, ...]], int]


def chain_hash(parent: int | None, tokens: tuple[int, ...]) -> int:
    return hash((parent, tokens))


@dataclass(eq=False)  # eq=False: two entries are the same entry only if they are the same object
class CachedBlock:
    """A full block of computed K/V that the prefix cache can find again."""
    block: int                        # the block's id in the pool
    hash: int                         # its name: the hash chain up to and including this block
    tokens: tuple[int, ...]           # the block_size token ids whose K/V it holds
    parent: "CachedBlock | None"      # the cached block just before it (None for a first block)


def block_hashes(token_ids: list[int], block_size: int, hash_fn: HashFn = chain_hash) -> list[int]:
    """The hash chain of the full blocks of token_ids (a last, partial block gets no name)."""
    hashes, parent = [], None
    for i in range(len(token_ids) // block_size):
        parent = hash_fn(parent, tuple(token_ids[i * block_size:(i + 1) * block_size]))
        hashes.append(parent)
    return hashes


def match_prefix(token_ids: list[int], block_size: int, cache: dict[int, CachedBlock],
                 hash_fn: HashFn = chain_hash) -> list[CachedBlock]:
    """The longest verified run of cached blocks at the start of a prompt. Only blocks before the
    prompt's last token may hit: that token is always computed, for its logits."""
    matched, parent = [], None
    for i, h in enumerate(block_hashes(token_ids[:-1], block_size, hash_fn)):
        entry = cache.get(h)
        if entry is None or entry.tokens != tuple(token_ids[i * block_size:(i + 1) * block_size]) \
                or entry.parent is not parent:
            break
        matched.append(entry)
        parent = entry
    return matched


class EvictableBlocks:
    """Named blocks that no sequence holds, least recently used first (entries: block id -> CachedBlock)."""

    def __init__(self) -> None:
        self.entries: OrderedDict[int, CachedBlock] = OrderedDict()

    def __len__(self) -> int:
        return len(self.entries)

    def add(self, entry: CachedBlock) -> None:
        """The last sequence holding entry.block let go of it: it becomes the most recently used."""
        self.entries[entry.block] = entry

    def reuse(self, block: int) -> None:
        """A prefix hit takes the block back into use: no longer evictable (still named)."""
        del self.entries[block]

    def evict(self, cache: dict[int, CachedBlock]) -> int:
        """Take the least recently used block for new K/V, forgetting its name. -> its id."""
        block, entry = self.entries.popitem(last=False)
        del cache[entry.hash]
        return block
