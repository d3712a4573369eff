"""BlockManager invariants under random operations (hypothesis), and its edge cases."""
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from minillm.cache.block_manager import BlockManager

BS = 4


class Model:
    """Drives a BlockManager like an engine would, and remembers what each table holds."""

    def __init__(self, num_blocks: int, prefix: bool) -> None:
        self.bm = BlockManager(num_blocks, BS, enable_prefix_caching=prefix)
        self.tables: dict[int, list[int]] = {}
        self.tokens: dict[int, list[int]] = {}
        self.next_id = 0

    def check(self) -> None:
        bm = self.bm
        refs = Counter(b for t in self.tables.values() for b in t)
        assert all(bm.ref_counts[b] == refs[b] for b in range(bm.num_blocks)), "ref counts != table references"
        free = list(bm.free_blocks) + list(bm.evictable)
        assert len(free) == len(set(free)), "a block is free twice"
        assert not set(free) & set(refs), "a referenced block is on a free list"
        assert len(free) + len(refs) == bm.num_blocks, "a block leaked"
        for sid, table in self.tables.items():
            assert len(table) == bm.blocks_for(len(self.tokens[sid])), "table does not cover its tokens"
            assert len(set(table)) == len(table), "a table holds a block twice: two tokens share a slot"
        assert all(bm.cached[bm.block_hash[b]] == b for b in range(bm.num_blocks) if bm.block_hash[b] is not None)


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
            got = m.bm.allocate(tokens)
            if got is not None:
                table, cached = got
                assert cached % BS == 0 and cached < len(tokens)
                m.tables[m.next_id], m.tokens[m.next_id] = table, list(tokens)
                m.bm.register(table, tokens, 0, len(tokens))
                m.next_id += 1
        elif op == "append" and sids:
            sid = sids[pick % len(sids)]
            before = list(m.tables[sid])
            result = m.bm.append(m.tables[sid], len(m.tokens[sid]) + 1)
            if result is False:
                assert m.tables[sid] == before, "a failed append changed the table"
            else:
                written = m.tables[sid][len(m.tokens[sid]) // BS]
                assert m.bm.ref_counts[written] == 1, "a token is written into a block another table shares"
                m.tokens[sid].append(pick % 4)
                m.bm.register(m.tables[sid], m.tokens[sid], 0, len(m.tokens[sid]))
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
    assert m.bm.num_free == num_blocks and sum(m.bm.ref_counts) == 0


def test_prefix_hit_reuses_blocks_and_leaves_the_last_token_to_compute():
    bm = BlockManager(16, BS)
    first, _ = bm.allocate(list(range(12)))
    bm.register(first, list(range(12)), 0, 12)
    second, cached = bm.allocate(list(range(12)))  # 12 tokens = 3 full blocks, last one recomputed
    assert cached == 8 and second[:2] == first[:2] and second[2] != first[2]
    third, cached = bm.allocate(list(range(10)) + [99, 98, 97])
    assert cached == 8 and third[:2] == first[:2]
    assert bm.ref_counts[first[0]] == 3


def test_hit_requires_the_same_parent_chain():
    bm = BlockManager(16, BS)
    a, _ = bm.allocate([1, 1, 1, 1, 2, 2, 2, 2, 0])
    bm.register(a, [1, 1, 1, 1, 2, 2, 2, 2, 0], 0, 9)
    b, cached = bm.allocate([3, 3, 3, 3, 2, 2, 2, 2, 0])  # same second block, different first
    assert cached == 0


def test_forced_hash_collision_is_a_miss_not_a_wrong_hit():
    bm = BlockManager(16, BS, hash_fn=lambda parent, tokens: 42)  # every block has the same name
    a, _ = bm.allocate([1, 2, 3, 4, 5])
    bm.register(a, [1, 2, 3, 4, 5], 0, 5)
    b, cached = bm.allocate([9, 9, 9, 9, 5])
    assert cached == 0 and bm.collisions == 1
    c, cached = bm.allocate([1, 2, 3, 4, 7])  # the genuine prefix still hits
    assert cached == 4 and c[0] == a[0]


def test_freed_cached_blocks_are_evicted_least_recently_used_first():
    bm = BlockManager(4, BS)
    old, _ = bm.allocate([1] * 4 + [0])
    bm.register(old, [1] * 4 + [0], 0, 5)
    new, _ = bm.allocate([2] * 4 + [0])
    bm.register(new, [2] * 4 + [0], 0, 5)
    old_block, new_block = old[0], new[0]
    bm.free(old)
    bm.free(new)
    assert list(bm.evictable) == [old_block, new_block]
    big, _ = bm.allocate([7] * 13)  # needs all 4 blocks: both cached ones are evicted, oldest first
    assert bm.evictions == 2 and bm.allocate([1] * 4 + [0]) is None
    bm.free(big)
    _, cached = bm.allocate([2] * 4 + [0])
    assert cached == 0


def test_exhausted_pool_says_no_and_changes_nothing():
    bm = BlockManager(3, BS)
    table, _ = bm.allocate(list(range(12)))
    assert bm.allocate([5]) is None
    assert bm.append(table, 13) is False and len(table) == 3
    bm.free(table)
    assert bm.num_free == 3


def test_append_into_a_shared_block_copies_it_first():
    bm = BlockManager(8, BS)
    parent, _ = bm.allocate([1, 2, 3, 4, 5, 6])  # second block half full
    child = bm.fork(parent)
    assert bm.append(child, 7) == (parent[1], child[1]) and child[1] != parent[1]
    assert child[0] == parent[0] and bm.ref_counts[parent[0]] == 2 and bm.ref_counts[parent[1]] == 1
    assert bm.append(parent, 7) is None  # now the parent's block is its own again
