"""BlockManager invariants under random operations (hypothesis), and its edge cases."""
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from minillm.arith import cdiv
from minillm.cache.block_manager import BlockManager, BlockTable
from minillm.config import Components

BS = 4


class Model:
    """Drives a BlockManager like an engine would, and remembers what each table holds."""

    def __init__(self, num_blocks: int, prefix: bool) -> None:
        self.bm = BlockManager(num_blocks, BS, enable_prefix_caching=prefix)
        self.tables: dict[int, BlockTable] = {}
        self.tokens: dict[int, list[int]] = {}
        self.next_id = 0

    def check(self) -> None:
        bm, refs_of = self.bm, self.bm.allocator.ref_counts
        refs = Counter(b for t in self.tables.values() for b in t.blocks)
        assert all(refs_of[b] == refs[b] + (b in bm.named) for b in range(bm.num_blocks)), \
            "ref counts != table references + the prefix cache's own"
        evictable = set(bm.evictable.entries)
        assert evictable == {b for b in bm.named if refs[b] == 0}, "evictable != named blocks no table holds"
        free = list(bm.allocator.free_blocks)
        assert len(free) == len(set(free)), "a block is free twice"
        assert not set(free) & (set(refs) | set(bm.named)), "a held block is on the free list"
        assert len(free) + len(set(refs) | set(bm.named)) == bm.num_blocks, "a block leaked"
        for sid, table in self.tables.items():
            assert len(table.blocks) == cdiv(len(self.tokens[sid]), BS), "table does not cover its tokens"
            assert len(set(table.blocks)) == len(table.blocks), "a table holds a block twice: two tokens share a slot"
            for i, entry in enumerate(table.named):
                assert entry.tokens == tuple(self.tokens[sid][i * BS:(i + 1) * BS]), "a table names a block wrongly"
        assert all(bm.cache[e.hash] is e and bm.named[e.block] is e for e in bm.cache.values())


ops = st.lists(st.tuples(st.sampled_from(["alloc", "append", "fork", "free"]),
                         st.integers(0, 50), st.lists(st.integers(0, 3), min_size=1, max_size=14)),
               max_size=40)


@settings(max_examples=150, deadline=None)
@given(ops=ops, num_blocks=st.integers(1, 24), prefix=st.booleans())
def test_random_operations_keep_every_invariant(ops, num_blocks, prefix):
    m = Model(num_blocks, prefix)
    for op, pick, tokens in ops:
        sids = sorted(m.tables)
        if op == "alloc":
            table = m.bm.allocate(tokens)
            if table is not None:
                assert len(table.named) * BS < len(tokens)
                m.tables[m.next_id], m.tokens[m.next_id] = table, list(tokens)
                m.bm.register(table, tokens, len(tokens))
                m.next_id += 1
        elif op == "append" and sids:
            sid = sids[pick % len(sids)]
            before = list(m.tables[sid].blocks)
            result = m.bm.append(m.tables[sid], len(m.tokens[sid]) + 1)
            if result is False:
                assert m.tables[sid].blocks == before, "a failed append changed the table"
            else:
                written = m.tables[sid].blocks[len(m.tokens[sid]) // BS]
                assert m.bm.allocator.ref_counts[written] == 1, "a token is written into a block another holds"
                m.tokens[sid].append(pick % 4)
                m.bm.register(m.tables[sid], m.tokens[sid], len(m.tokens[sid]))
        elif op == "fork" and sids:
            sid = sids[pick % len(sids)]
            m.tables[m.next_id], m.tokens[m.next_id] = m.bm.fork(m.tables[sid]), list(m.tokens[sid])
            m.next_id += 1
        elif op == "free" and sids:
            sid = sids[pick % len(sids)]
            m.bm.free(m.tables.pop(sid))
            del m.tokens[sid]
        m.check()
    for sid in list(m.tables):
        m.bm.free(m.tables.pop(sid))
    assert m.bm.num_free == num_blocks and m.bm.num_used == 0
    assert sum(m.bm.allocator.ref_counts) == len(m.bm.named), "only the prefix cache holds blocks at the end"


def test_prefix_hit_reuses_blocks_and_leaves_the_last_token_to_compute():
    bm = BlockManager(16, BS)
    first = bm.allocate(list(range(12)))
    bm.register(first, list(range(12)), 12)
    second = bm.allocate(list(range(12)))  # 12 tokens = 3 full blocks, the last one recomputed
    assert len(second.named) == 2 and second.blocks[:2] == first.blocks[:2] and second.blocks[2] != first.blocks[2]
    third = bm.allocate(list(range(10)) + [99, 98, 97])
    assert len(third.named) == 2 and third.blocks[:2] == first.blocks[:2]
    assert bm.holders(first.blocks[0]) == 3


def test_hit_requires_the_same_parent_chain():
    bm = BlockManager(16, BS)
    a = bm.allocate([1, 1, 1, 1, 2, 2, 2, 2, 0])
    bm.register(a, [1, 1, 1, 1, 2, 2, 2, 2, 0], 9)
    b = bm.allocate([3, 3, 3, 3, 2, 2, 2, 2, 0])  # same second block, different first
    assert b.named == []


def test_a_partial_hit_names_the_blocks_computed_after_it():
    bm = BlockManager(16, BS)
    system = [7] * 8
    a = bm.allocate(system + [1])
    bm.register(a, system + [1], 9)
    b_tokens = system + [2, 3, 4, 5, 6, 7, 8, 9, 0]
    b = bm.allocate(b_tokens)
    assert len(b.named) == 2
    bm.register(b, b_tokens, len(b_tokens))
    assert len(b.named) == 4, "blocks computed after a prefix hit must be named too"
    c = bm.allocate(b_tokens)
    assert len(c.named) == 4 and c.blocks[:4] == b.blocks[:4]


def test_forced_hash_collision_is_a_miss_not_a_wrong_hit():
    bm = BlockManager(16, BS, components=Components(hash_fn=lambda parent, tokens: 42))  # one name for all
    a = bm.allocate([1, 2, 3, 4, 5])
    bm.register(a, [1, 2, 3, 4, 5], 5)
    b = bm.allocate([9, 9, 9, 9, 5])
    assert b.named == [] and bm.collisions == 1
    c = bm.allocate([1, 2, 3, 4, 7])  # the genuine prefix still hits
    assert len(c.named) == 1 and c.blocks[0] == a.blocks[0]


def test_freed_cached_blocks_are_evicted_least_recently_used_first():
    bm = BlockManager(4, BS)
    old = bm.allocate([1] * 4 + [0])
    bm.register(old, [1] * 4 + [0], 5)
    new = bm.allocate([2] * 4 + [0])
    bm.register(new, [2] * 4 + [0], 5)
    old_block, new_block = old.blocks[0], new.blocks[0]
    bm.free(old)
    bm.free(new)
    assert list(bm.evictable.entries) == [old_block, new_block]
    big = bm.allocate([7] * 13)  # needs all 4 blocks: both cached ones are evicted, oldest first
    assert bm.evictions == 2 and bm.allocate([1] * 4 + [0]) is None
    bm.free(big)
    assert bm.allocate([2] * 4 + [0]).named == []


def test_a_hit_makes_an_evictable_block_the_most_recently_used_again():
    bm = BlockManager(7, BS)
    tables = [bm.allocate([t] * 4 + [0]) for t in (1, 2, 3)]
    for t, table in zip((1, 2, 3), tables):
        bm.register(table, [t] * 4 + [0], 5)
        bm.free(table)
    bm.free(bm.allocate([1] * 4 + [9]))  # a hit on the oldest: now the most recently used
    bm.free(bm.allocate([5] * 17))  # 5 blocks: the 4 free ones, then one eviction: 2's block, now the oldest
    assert bm.evictions == 1
    assert [len(bm.allocate([t] * 4 + [0]).named) for t in (2, 1, 3)] == [0, 1, 1]


def test_exhausted_pool_says_no_and_changes_nothing():
    bm = BlockManager(3, BS)
    table = bm.allocate(list(range(12)))
    assert bm.allocate([5]) is None
    assert bm.append(table, 13) is False and len(table.blocks) == 3
    bm.free(table)
    assert bm.num_free == 3


def test_append_into_a_shared_block_copies_it_first():
    bm = BlockManager(8, BS)
    parent = bm.allocate([1, 2, 3, 4, 5, 6])  # second block half full
    child = bm.fork(parent)
    p, c = parent.blocks, child.blocks
    assert bm.append(child, 7) == (p[1], c[1]) and c[1] != p[1]
    assert c[0] == p[0] and bm.holders(p[0]) == 2 and bm.holders(p[1]) == 1
    assert bm.append(parent, 7) is None  # now the parent's block is its own again
