"""Grader of lab 03, the paged KV cache and prefix caching. Oracles: minillm's model, block
allocator, prefix cache, attention and engine, and the invariants every allocator must keep.
Inputs reach the boundaries: 0 tokens, exact block multiples and one token past them, a pool filled
to its last block by allocate and by append, an empty range of positions, a context filling the
whole pool, hash collisions. Model and small-tensor tests run on one torch thread."""
import random
from functools import cache

import torch

from minillm import LLM
from minillm.arith import cdiv
from minillm.cache import prefix_cache as reference
from minillm.cache.allocator import BlockAllocator as ReferenceAllocator
from minillm.cache.prefix_cache import chain_hash
from minillm.labkit import exercise
from minillm.labkit.endtoend import check_against_reference
from minillm.labkit.fixtures import assert_close, one_thread, randn
from minillm.labkit.plug import lab_components
from minillm.layers.attention import AttentionContext, causal_attention

EXERCISES = {"3.1": "BlockAllocator", "3.2": "slot_mapping", "3.3": "paged_attention", "3.4": "block_hashes",
             "3.5": "match_prefix", "3.6": "EvictableBlocks", "3.E": "your parts in the real engine"}


@cache
def llm() -> LLM:
    return LLM("tiny")


def reference_slots(table: list[int], start: int, end: int, block_size: int) -> list[int]:
    """Every slot of every block of the table, in order, then the positions' share of them."""
    return [b * block_size + o for b in table for o in range(block_size)][start:end]


def check_invariants(alloc, tables: list[list[int]], what: str) -> None:
    """Ref counts equal the tables holding each block; free blocks are exactly the unheld ones."""
    held = [0] * alloc.num_blocks
    for t in tables:
        for b in t:
            assert 0 <= b < alloc.num_blocks, f"{what}: block id {b} is outside the pool of {alloc.num_blocks}"
            held[b] += 1
    assert list(alloc.ref_counts) == held, f"{what}: ref_counts {list(alloc.ref_counts)} but the tables hold {held}"
    free = list(alloc.free_blocks)
    assert len(free) == len(set(free)), f"{what}: a block is on the free list twice ({sorted(free)})"
    unheld = {b for b in range(alloc.num_blocks) if not held[b]}
    assert set(free) == unheld, (f"{what}: free list {sorted(free)}, but the blocks no table holds are "
                                 f"{sorted(unheld)}")
    assert alloc.num_free == len(unheld), f"{what}: num_free is {alloc.num_free}, {len(unheld)} blocks are unheld"


@exercise("3.1")
def test_blocks_for_rounds_up_exactly_at_block_boundaries(lab):
    """blocks_for(n) is the fewest blocks that hold n tokens, for n = 0..50 and block sizes 1, 3, 16"""
    for bs in (1, 3, 16):
        alloc = lab.BlockAllocator(8, bs)
        got = [alloc.blocks_for(n) for n in range(0, 51)]
        expected = [cdiv(n, bs) for n in range(0, 51)]
        bad = [(n, g, e) for n, g, e in zip(range(0, 51), got, expected) if g != e]
        assert not bad, f"block_size {bs}: (tokens, blocks_for, expected) {bad[:4]}"


@exercise("3.1")
def test_allocate_gives_distinct_blocks_and_refuses_without_change(lab):
    """allocate hands out just enough distinct blocks for n tokens; when too few are free it returns None and
    changes nothing"""
    alloc = lab.BlockAllocator(10, 4)
    a, b = alloc.allocate(9), alloc.allocate(24)
    assert a is not None and b is not None, "allocate(9) then allocate(24) in a pool of 10 blocks of 4 returned None"
    assert (len(a), len(b)) == (3, 6), f"tables of {len(a)} and {len(b)} blocks for 9 and 24 tokens of block size 4"
    check_invariants(alloc, [a, b], "after allocate(9), allocate(24)")
    assert alloc.allocate(5) is None, "allocate(5) (2 blocks) succeeded with 1 block free"
    check_invariants(alloc, [a, b], "after a refused allocate(5) with 1 block free")
    c = alloc.allocate(4)
    assert c is not None and len(c) == 1, f"allocate(4) with 1 block free gave {c}"
    assert alloc.allocate(1) is None, "allocate(1) succeeded in a full pool"
    alloc.free(a)
    d = alloc.allocate(12)
    assert d is not None and len(d) == 3, f"after freeing 3 blocks, allocate(12) gave {d}"
    check_invariants(alloc, [b, c, d], "after free, then allocate")


@exercise("3.1")
def test_append_adds_a_block_only_past_the_last_full_one(lab):
    """append grows the table by one block exactly when the token count passes a multiple of block_size"""
    for bs in (1, 4, 5):
        alloc = lab.BlockAllocator(40, bs)
        table = alloc.allocate(bs)
        sizes = []
        for n in range(bs + 1, 4 * bs + 2):
            assert alloc.append(table, n) is True, f"block size {bs}: append(table, {n}) did not return True"
            sizes.append(len(table))
        expected = [cdiv(n, bs) for n in range(bs + 1, 4 * bs + 2)]
        assert sizes == expected, f"block size {bs}: table lengths {sizes} while growing, expected {expected}"
        check_invariants(alloc, [table], f"block size {bs}, after appends")


@exercise("3.1")
def test_append_without_room_returns_false_and_keeps_the_table(lab):
    """append in a full pool returns False, leaves the table and the pool unchanged"""
    alloc = lab.BlockAllocator(3, 4)
    a, b = alloc.allocate(8), alloc.allocate(3)
    assert alloc.append(b, 4) is True, "append within the last block's room did not return True"
    before = list(a)
    assert alloc.append(a, 9) is False, "append needing a block in a full pool did not return False"
    assert a == before, f"the table changed from {before} to {a} on a refused append"
    check_invariants(alloc, [a, b], "after a refused append")


FORK_ALIASES = ("3.1 fork returned the table it was given: the two samples would share the same list object, so a "
                "block one of them appends would appear in the other's table too")


@exercise("3.1")
def test_forked_blocks_return_only_when_the_last_table_frees_them(lab):
    """a forked table shares blocks: freeing one owner keeps them, freeing both returns them"""
    alloc = lab.BlockAllocator(6, 2)
    a = alloc.allocate(5)
    b = alloc.fork(a)
    assert b is not a, FORK_ALIASES
    assert b == a, f"3.1 fork gave the table {b} for the table {a}: a fork lists the same blocks in the same order"
    check_invariants(alloc, [a, b], "after fork")
    alloc.free(a)
    assert a == [], "free did not empty the table"
    check_invariants(alloc, [b], "after freeing one of two sharing tables")
    c = alloc.allocate(6)
    assert c is not None and not set(c) & set(b), f"allocate gave {c}, reusing blocks still held by {b}"
    alloc.free(b)
    alloc.free(c)
    check_invariants(alloc, [], "after freeing every table")


@exercise("3.1")
def test_random_workload_keeps_counts_and_leaks_nothing(lab):
    """300 random allocate / append / fork / free operations: ref counts and the free list stay exact"""
    rng = random.Random(31)
    for bs in (1, 3, 8):
        alloc, live = lab.BlockAllocator(23, bs), []  # live: [table, tokens]
        for step in range(300):
            op = rng.random()
            if op < 0.3 or not live:
                n = rng.randint(1, 4 * bs + 1)
                table = alloc.allocate(n)
                if table is not None:
                    assert len(table) == cdiv(n, bs), f"block size {bs}: allocate({n}) gave {len(table)} blocks"
                    live.append([table, n])
            elif op < 0.65:
                item = rng.choice(live)
                n = item[1] + rng.randint(1, bs + 1)
                if alloc.append(item[0], n):
                    item[1] = n
            elif op < 0.75:
                table, n = rng.choice(live)
                live.append([alloc.fork(table), n])
            else:
                table, _ = live.pop(rng.randrange(len(live)))
                alloc.free(table)
            check_invariants(alloc, [t for t, _ in live], f"block size {bs}, operation {step}")
        for table, _ in live:
            alloc.free(table)
        assert alloc.num_free == 23, f"block size {bs}: {23 - alloc.num_free} blocks leaked after freeing every table"


@exercise("3.1")
def test_a_pool_fills_exactly_to_capacity(lab):
    """a prompt of exactly the pool's capacity takes every block, first to last; one token more is refused"""
    for num_blocks, bs in ((5, 4), (7, 1), (3, 16)):
        alloc = lab.BlockAllocator(num_blocks, bs)
        what = f"a pool of {num_blocks} blocks of {bs}"
        assert alloc.allocate(num_blocks * bs + 1) is None, f"{what}: allocate({num_blocks * bs + 1}) succeeded"
        check_invariants(alloc, [], f"{what}, after a refused allocate of one token over capacity")
        table = alloc.allocate(num_blocks * bs)
        assert table is not None and sorted(table) == list(range(num_blocks)), \
            f"{what}: allocate({num_blocks * bs}) gave {table}, expected every block 0..{num_blocks - 1} once"
        assert alloc.append(table, num_blocks * bs) is True, f"{what}: append to the tokens it already holds failed"
        assert alloc.append(table, num_blocks * bs + 1) is False and len(table) == num_blocks, \
            f"{what}: a full table grew past the pool (or append did not return False)"
        assert alloc.allocate(1) is None, f"{what}: allocate(1) succeeded in a full pool"
        check_invariants(alloc, [table], f"{what}, full")
        alloc.free(table)
        check_invariants(alloc, [], f"{what}, after freeing the full table")


@exercise("3.1")
def test_append_hands_out_the_pools_last_free_block(lab):
    """a table growing into the pool's last free block gets it; the next block it needs is refused"""
    for num_blocks, bs in ((4, 4), (6, 1), (2, 16)):
        alloc = lab.BlockAllocator(num_blocks, bs)
        what = f"a pool of {num_blocks} blocks of {bs}"
        table = alloc.allocate((num_blocks - 1) * bs)
        assert table is not None and len(table) == num_blocks - 1, \
            f"{what}: allocate({(num_blocks - 1) * bs}) gave {table}, not {num_blocks - 1} blocks"
        assert alloc.append(table, (num_blocks - 1) * bs + 1) is True and len(table) == num_blocks, \
            f"{what}: append into the last free block returned False or did not take it (table {table})"
        check_invariants(alloc, [table], f"{what}, after append took the last free block")
        assert alloc.append(table, num_blocks * bs + 1) is False and len(table) == num_blocks, \
            f"{what}: append past a full pool did not return False with the table unchanged"
        check_invariants(alloc, [table], f"{what}, after a refused append in a full pool")


@exercise("3.1")
def test_a_prompt_of_exactly_one_block_takes_one_block(lab):
    """n = block_size tokens take one block, n + 1 a second; appends inside the last block take none"""
    for bs in (1, 4, 16):
        alloc = lab.BlockAllocator(6, bs)
        table = alloc.allocate(bs)
        assert table is not None and len(table) == 1, f"block size {bs}: allocate({bs}) gave {table}, not one block"
        assert alloc.append(table, bs) is True and len(table) == 1, \
            f"block size {bs}: append to {bs} tokens gave a table of {len(table)} blocks"
        assert alloc.append(table, bs + 1) is True and len(table) == 2, \
            f"block size {bs}: append to {bs + 1} tokens gave a table of {len(table)} blocks, expected 2"
        other = alloc.allocate(2 * bs)
        assert other is not None and len(other) == 2, f"block size {bs}: allocate({2 * bs}) gave {other}, not 2 blocks"
        check_invariants(alloc, [table, other], f"block size {bs}")


@exercise("3.1")
def test_a_fork_and_its_original_can_be_freed_in_either_order(lab):
    """freeing the fork first (or the original first) keeps the shared blocks for the other; a fork of a fork
    counts 3"""
    for fork_first in (True, False):
        alloc = lab.BlockAllocator(7, 3)
        a = alloc.allocate(7)  # 3 blocks, the last one partly filled
        b = alloc.fork(a)
        c = alloc.fork(b)
        assert b is not a and c is not b, FORK_ALIASES
        check_invariants(alloc, [a, b, c], "after two forks of one table")
        first, second = (b, a) if fork_first else (a, b)
        alloc.free(first)
        assert first == [], "free did not empty the table"
        check_invariants(alloc, [second, c], f"after freeing the {'fork' if fork_first else 'original'} first")
        alloc.free(c)
        check_invariants(alloc, [second], f"after freeing the {'fork' if fork_first else 'original'} and a fork of it")
        assert alloc.append(second, 10) and len(second) == 4, "the table left holding the shared blocks cannot grow"
        alloc.free(second)
        check_invariants(alloc, [], "after freeing every table")


def assert_same_up_to_renaming(alloc, oracle, tables: list, oracle_tables: list, what: str) -> None:
    """The two allocators agree but for block ids: tables of the same lengths, sharing the same
    blocks in the same places, with the same ref counts, and as many blocks free."""
    rename = {}
    for t, o in zip(tables, oracle_tables):
        assert len(t) == len(o), f"{what}: a table of {len(t)} blocks where minillm's allocator has {len(o)}"
        for b, r in zip(t, o):
            assert rename.setdefault(b, r) == r, f"{what}: the tables share blocks differently from minillm's allocator"
    assert len(set(rename.values())) == len(rename), \
        f"{what}: the tables share blocks differently from minillm's allocator"
    counts = {b: alloc.ref_counts[b] for b in rename}
    expected = {b: oracle.ref_counts[r] for b, r in rename.items()}
    assert counts == expected, f"{what}: ref counts {counts}, minillm's allocator has {expected} for the same blocks"
    assert alloc.num_free == oracle.num_free, \
        f"{what}: {alloc.num_free} blocks free, minillm's allocator has {oracle.num_free}"


@exercise("3.1")
def test_random_operations_match_minillms_allocator(lab):
    """seeded random allocate / append / fork / free sequences, often at exact block multiples and a full
    pool, agree step by step with minillm's BlockAllocator (up to which block ids are handed out)"""
    for seed, (num_blocks, bs) in enumerate(((9, 1), (11, 3), (6, 4), (16, 8)), start=3100):
        rng = random.Random(seed)
        alloc, oracle, live = lab.BlockAllocator(num_blocks, bs), ReferenceAllocator(num_blocks, bs), []
        for step in range(250):
            what = f"block size {bs}, pool of {num_blocks}, seed {seed}, operation {step}"
            op, n = rng.random(), bs * rng.randint(0, 3) + rng.choice((0, 0, 1, bs - 1))
            if op < 0.3 or not live:
                n = max(n, 1)
                table, expected = alloc.allocate(n), oracle.allocate(n)
                refused = "refused" if expected is None else "did not"
                assert (table is None) == (expected is None), f"{what}: allocate({n}) gave {table}, minillm's {refused}"
                if table is not None:
                    live.append([table, expected, n])
            elif op < 0.6:
                item = rng.choice(live)
                n = item[2] + max(n, 1)
                grew, expected = alloc.append(item[0], n), oracle.append(item[1], n)
                assert grew == expected, f"{what}: append to {n} tokens returned {grew}, minillm's allocator {expected}"
                item[2] = n if grew else item[2]
            elif op < 0.75:
                table, expected, n = rng.choice(live)
                live.append([alloc.fork(table), oracle.fork(expected), n])
            else:
                table, expected, _ = live.pop(rng.randrange(len(live)))
                alloc.free(table)
                oracle.free(expected)
            check_invariants(alloc, [t for t, _, _ in live], what)
            assert_same_up_to_renaming(alloc, oracle, [t for t, _, _ in live], [o for _, o, _ in live], what)


@exercise("3.2")
def test_slot_mapping_follows_the_block_table(lab):
    """slots of positions start..end-1 through a shuffled table, for block sizes 1, 4 and 5, empty ranges included"""
    for bs, table in ((4, [5, 1, 6]), (5, [9, 0, 3, 7, 2]), (1, [4, 2, 8, 0, 6])):
        total = len(table) * bs
        for start, end in ((0, total), (0, total - 2), (bs - 1, bs + 1), (bs, total), (total - 1, total), (bs, bs)):
            got = lab.slot_mapping(table, start, end, bs)
            assert isinstance(got, torch.Tensor), f"slot_mapping returns {type(got).__name__}, not a tensor"
            expected = reference_slots(table, start, end, bs)
            assert got.tolist() == expected, (f"slot_mapping({table}, {start}, {end}, block_size={bs}) gave "
                                              f"{got.tolist()}, expected {expected}")


@exercise("3.2")
def test_slot_mapping_matches_the_formula_on_random_tables(lab):
    """seeded random tables, block sizes and ranges: each position's slot is the one its block-table entry and
    offset give, as in the worked examples"""
    with one_thread():
        gen = torch.Generator().manual_seed(320)
        for _ in range(40):
            bs = int(torch.randint(1, 17, (1,), generator=gen))
            table = torch.randperm(30, generator=gen)[:int(torch.randint(1, 9, (1,), generator=gen))].tolist()
            start, end = sorted(torch.randint(0, len(table) * bs + 1, (2,), generator=gen).tolist())
            got = lab.slot_mapping(table, start, end, bs)
            expected = reference_slots(table, start, end, bs)
            assert isinstance(got, torch.Tensor) and got.tolist() == expected, \
                f"slot_mapping({table}, {start}, {end}, block_size={bs}) gave {got.tolist()}, expected {expected}"


@exercise("3.2")
def test_slot_mapping_is_int64(lab):
    """the slots are an int64 tensor, usable as an index, for an empty range of positions too"""
    for table, start, end in (([3, 0], 2, 7), ([3, 0], 4, 4), ([1], 0, 0)):
        got = lab.slot_mapping(table, start, end, 4)
        what = f"slot_mapping({table}, {start}, {end}, block_size=4)"
        assert isinstance(got, torch.Tensor) and got.dtype == torch.int64, \
            f"{what}: returns {type(got).__name__} of dtype {getattr(got, 'dtype', None)}, not an int64 tensor"
        assert got.shape == (end - start,), f"{what}: shape {tuple(got.shape)}, expected ({end - start},)"


def scattered_pool(seed: int, num_blocks: int, bs: int, context_len: int, kv_heads: int = 2, d: int = 8):
    """A pool of random values with a sequence's K/V written in shuffled blocks:
    -> k_cache, v_cache [slots, kv_heads, d], table, keys, values [context_len, kv_heads, d]."""
    gen = torch.Generator().manual_seed(seed)
    k_cache, v_cache = randn(seed, num_blocks * bs, kv_heads, d), randn(seed + 1, num_blocks * bs, kv_heads, d)
    table = torch.randperm(num_blocks, generator=gen)[:cdiv(context_len, bs)].tolist()
    keys, values = randn(seed + 2, context_len, kv_heads, d), randn(seed + 3, context_len, kv_heads, d)
    slots = torch.tensor(reference_slots(table, 0, context_len, bs))
    k_cache[slots], v_cache[slots] = keys, values
    return k_cache, v_cache, table, keys, values


@exercise("3.3")
def test_paged_attention_equals_contiguous_attention(lab):
    """through a shuffled table, decode, chunk and whole-prompt queries match attention over contiguous K/V,
    up to a context that fills the whole pool (first and last block included)"""
    with one_thread():
        cases = [(301, 12, 4, 13, 1), (302, 12, 4, 13, 5), (303, 12, 5, 20, 20), (304, 20, 1, 7, 3),
                 (305, 12, 16, 37, 2), (306, 6, 4, 24, 1), (307, 6, 4, 24, 24), (308, 5, 3, 15, 7), (309, 9, 4, 4, 4)]
        gen = torch.Generator().manual_seed(330)
        for seed in range(310, 318):  # seeded random shapes
            num_blocks = int(torch.randint(2, 10, (1,), generator=gen))
            bs = int(torch.randint(1, 9, (1,), generator=gen))
            ctx = int(torch.randint(1, num_blocks * bs + 1, (1,), generator=gen))
            cases.append((seed, num_blocks, bs, ctx, int(torch.randint(1, ctx + 1, (1,), generator=gen))))
        for seed, num_blocks, bs, ctx, n in cases:
            k_cache, v_cache, table, keys, values = scattered_pool(seed, num_blocks, bs, ctx)
            q = randn(seed + 4, n, 4, 8)
            got = lab.paged_attention(q, k_cache, v_cache, table, ctx, bs)
            assert_close(got, causal_attention(q, keys, values),
                         f"paged_attention(block_size={bs}, context_len={ctx}, {n} queries)")


class LabPagedContext(AttentionContext):
    """One sequence in a pool of shuffled blocks: writes K/V by the reference slots, attends with
    the lab's paged_attention."""

    def __init__(self, paged_attention, cfg, num_blocks: int, bs: int, seed: int) -> None:
        shape = (cfg.num_hidden_layers, num_blocks * bs, cfg.num_key_value_heads, cfg.head_dim)
        self.k, self.v = randn(seed, *shape), randn(seed + 1, *shape)  # garbage where nothing was written
        self.table = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed)).tolist()
        self.paged_attention, self.bs, self.length = paged_attention, bs, 0

    def attend(self, layer_idx, q, k, v):
        end = self.length + q.shape[0]
        slots = torch.tensor(reference_slots(self.table, self.length, end, self.bs))
        self.k[layer_idx, slots], self.v[layer_idx, slots] = k, v
        return self.paged_attention(q, self.k[layer_idx], self.v[layer_idx], self.table, end, self.bs)


@exercise("3.3")
def test_paged_attention_runs_the_model_like_a_full_forward(lab):
    """the model through your paged attention: prefill 11, a chunk of 5, 2 decodes = one full forward"""
    with one_thread():
        model = llm().model
        ids = torch.randint(1, model.config.vocab_size, (18,), generator=torch.Generator().manual_seed(306))
        ctx = LabPagedContext(lab.paged_attention, model.config, 8, 3, 307)
        logits, start = [], 0
        with torch.no_grad():
            for n in (11, 5, 1, 1):
                hidden = model(ids[start:start + n], torch.arange(start, start + n), ctx)
                logits.append(model.compute_logits(hidden))
                ctx.length, start = ctx.length + n, start + n
        assert_close(torch.cat(logits), llm().logits(ids), "logits through paged attention vs a full forward",
                     atol=1e-3)


def tokens(seed: int, n: int) -> list[int]:
    return torch.randint(0, 1000, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@exercise("3.4")
def test_block_hashes_follow_the_chain_over_full_blocks(lab):
    """one name per full block, h_i = hash(h_{i-1}, block i), for lengths on and off block boundaries"""
    for bs, n in ((4, 17), (4, 16), (7, 6), (1, 5), (16, 50)):
        ids = tokens(400 + n, n)
        got, expected = list(lab.block_hashes(ids, bs)), reference.block_hashes(ids, bs)
        what = f"block_hashes of {n} tokens, block size {bs}"
        assert len(got) == len(expected), f"{what}: {len(got)} names for {len(expected)} full blocks"
        wrong = [i for i, (g, e) in enumerate(zip(got, expected)) if g != e]
        assert not wrong, f"{what}: names {wrong} differ from the chain h_i = hash(h_(i-1), tokens of block i)"


@exercise("3.4")
def test_block_hashes_use_the_given_hash_function(lab):
    """hash_fn is called as hash_fn(parent name, tuple of the block's tokens)"""
    calls = []

    def recording(parent, block):
        calls.append((parent, block))
        return 1000 + len(calls)
    ids = tokens(411, 10)
    got = lab.block_hashes(ids, 3, hash_fn=recording)
    expected = [(None, tuple(ids[0:3])), (1001, tuple(ids[3:6])), (1002, tuple(ids[6:9]))]
    assert calls == expected, f"hash_fn calls {calls}, expected {expected}"
    assert list(got) == [1001, 1002, 1003], f"names {list(got)}, expected what hash_fn returned: [1001, 1002, 1003]"


@exercise("3.4")
def test_block_hashes_match_minillm_on_random_prompts(lab):
    """seeded random prompts and block sizes, lengths on, just below and just above block boundaries"""
    rng = random.Random(430)
    for _ in range(40):
        bs = rng.randint(1, 9)
        n = max(0, bs * rng.randint(0, 6) + rng.choice((-1, 0, 1)))
        ids = [rng.randrange(50) for _ in range(n)]
        got, expected = list(lab.block_hashes(ids, bs)), reference.block_hashes(ids, bs)
        assert len(got) == len(expected), f"block_hashes of {n} tokens, block size {bs}: {len(got)} names, " \
                                          f"expected one per full block: {len(expected)}"
        assert got == expected, f"block_hashes of {n} tokens, block size {bs}: names differ from the hash chain"


@exercise("3.4")
def test_a_block_name_depends_on_the_prefix_before_it(lab):
    """the same block after different prefixes gets different names; a shared prefix shares names"""
    shared, a, b, tail = tokens(421, 8), tokens(422, 4), tokens(423, 4), tokens(424, 8)
    first, second = lab.block_hashes(shared + a + tail, 4), lab.block_hashes(shared + b + tail, 4)
    assert first[:2] == second[:2], "two prompts with the same first 8 tokens got different names for them"
    assert first[3] != second[3] and first[4] != second[4], \
        "identical blocks after different prefixes got the same name"


def register(lab, token_ids: list[int], bs: int, cache: dict, hash_fn=chain_hash, first_block: int = 0) -> list:
    """Cache entries (the notebook's CachedBlock) for every full block of token_ids, chained, as
    the engine registers them: a name already taken by another prefix ends the chain; -> the entries."""
    entries, parent = [], None
    for i in range(len(token_ids) // bs):
        block_tokens = tuple(token_ids[i * bs:(i + 1) * bs])
        h = hash_fn(None if parent is None else parent.hash, block_tokens)
        entry = cache.setdefault(h, lab.CachedBlock(first_block + i, h, block_tokens, parent))
        if entry.tokens != block_tokens or entry.parent is not parent:
            break
        entries.append(entry)
        parent = entry
    return entries


def matched_blocks(result) -> list[int]:
    return [e.block for e in result]


@exercise("3.5")
def test_match_prefix_finds_the_longest_cached_run(lab):
    """a prompt extending a cached one hits every cached block; a divergent one stops where it diverges"""
    cache, seen = {}, tokens(501, 42)  # block size 8: 5 full blocks, blocks 10..14
    register(lab, seen, 8, cache, first_block=10)
    for query, expected in ((seen + tokens(502, 9), [10, 11, 12, 13, 14]),
                            (seen[:20] + tokens(503, 30), [10, 11]),
                            (tokens(504, 40), []),
                            (seen[:17], [10, 11])):
        got = matched_blocks(lab.match_prefix(query, 8, cache))
        assert got == expected, f"a {len(query)}-token prompt matched blocks {got}, expected {expected}"


@exercise("3.5")
def test_match_prefix_always_leaves_the_last_token_to_compute(lab):
    """a prompt of exactly k cached full blocks reuses k - 1 of them (its last token must be computed)"""
    cache, seen = {}, tokens(511, 28)
    register(lab, seen, 4, cache)
    for n, expected in ((24, 5), (25, 6), (4, 0), (5, 1), (3, 0), (1, 0), (28, 6)):
        got = matched_blocks(lab.match_prefix(seen[:n], 4, cache))
        assert len(got) == expected, f"a {n}-token prompt (block size 4) reused {len(got)} blocks, expected {expected}"


@exercise("3.5")
def test_match_prefix_matches_minillm_on_random_chains_with_collisions(lab):
    """seeded random prompts cached under a weak hash (names collide often), then prompts that extend, cut or
    alter them: the same entries as minillm's match_prefix, in order"""

    def weak(parent, block):  # 5 names in all: collisions everywhere
        return (3 * (-1 if parent is None else parent) + sum(block)) % 5
    rng = random.Random(530)
    for trial in range(16):
        bs, cache, seen = rng.randint(1, 5), {}, []
        for i in range(6):
            base = rng.choice(seen) if seen and rng.random() < 0.5 else []
            ids = base[:rng.randint(0, len(base))] + [rng.randrange(3) for _ in range(rng.randint(1, 5 * bs))]
            register(lab, ids, bs, cache, hash_fn=weak, first_block=100 * i)
            seen.append(ids)
        for _ in range(10):
            query = list(rng.choice(seen))
            if rng.random() < 0.5 and query:
                query[rng.randrange(len(query))] = rng.randrange(3)
            query = query[:rng.randint(1, len(query))] + [rng.randrange(3) for _ in range(rng.randint(0, 2 * bs))]
            got = list(lab.match_prefix(query, bs, cache, hash_fn=weak))
            expected = reference.match_prefix(query, bs, cache, hash_fn=weak)
            assert [id(e) for e in got] == [id(e) for e in expected], \
                (f"trial {trial}, block size {bs}, a {len(query)}-token prompt: matched blocks {matched_blocks(got)}, "
                 f"expected the entries of blocks {matched_blocks(expected)}")


@exercise("3.5")
def test_match_prefix_rejects_a_hash_collision(lab):
    """an entry found under the right name but holding other tokens is a miss, not a hit"""

    def weak(parent, block):  # a deliberately weak hash: only the parent and the first token count
        return hash((parent, block[0]))
    cache, query = {}, tokens(521, 21)
    other = query[:8] + [query[8]] + [t + 1 for t in query[9:12]] + query[12:]  # block 2 differs after its first token
    register(lab, other, 4, cache, hash_fn=weak)
    got = matched_blocks(lab.match_prefix(query, 4, cache, hash_fn=weak))
    assert got == [0, 1], f"matched blocks {got}: the entry of block 2 holds other tokens under the same name"


@exercise("3.5")
def test_match_prefix_checks_the_parent_entry(lab):
    """an entry with the right name and tokens whose parent is another entry is a miss"""
    cache, query = {}, tokens(531, 17)
    chain = register(lab, query, 4, cache)  # blocks 0..3
    impostor = lab.CachedBlock(7, chain[1].hash, chain[1].tokens, lab.CachedBlock(8, chain[0].hash, (1, 2, 3, 4), None))
    cache[chain[2].hash] = lab.CachedBlock(9, chain[2].hash, chain[2].tokens, impostor)
    got = matched_blocks(lab.match_prefix(query, 4, cache))
    assert got == [0, 1], (f"matched blocks {got}: block 2's entry has the right name and tokens but a different "
                           f"parent entry, so its K/V belong to another prefix")


def entry(lab, block: int) -> object:
    return lab.CachedBlock(block, 1000 + block, (block,), None)


@exercise("3.6")
def test_eviction_takes_the_least_recently_freed_first(lab):
    """blocks added 4, 1, 3 are evicted 4, 1, 3, and each eviction removes that block's name from the cache"""
    pool = lab.EvictableBlocks()
    entries = [entry(lab, b) for b in (4, 1, 3)]
    cache = {e.hash: e for e in entries} | {2000: entry(lab, 9)}
    for e in entries:
        pool.add(e)
    assert len(pool) == 3, f"{len(pool)} evictable blocks after adding 3"
    order = [pool.evict(cache) for _ in range(3)]
    assert order == [4, 1, 3], f"evicted {order}, expected least recently freed first: [4, 1, 3]"
    assert list(cache) == [2000], f"names left in the cache: {sorted(cache)}, expected only the unrelated 2000"
    assert len(pool) == 0, f"{len(pool)} evictable blocks left after evicting all 3"


@exercise("3.6")
def test_a_reused_block_is_not_evicted_and_returns_as_most_recent(lab):
    """a prefix hit removes a block from the evictable ones (still cached); freed again, it is the newest"""
    pool = lab.EvictableBlocks()
    entries = {b: entry(lab, b) for b in (5, 2, 7, 0)}
    cache = {e.hash: e for e in entries.values()}
    for e in entries.values():
        pool.add(e)
    pool.reuse(2)
    assert len(pool) == 3 and 1002 in cache, "reuse(2) must take block 2 out of the evictable ones and keep its name"
    assert pool.evict(cache) == 5, "the least recently used block (5) was not evicted first"
    pool.add(entries[2])
    order = [pool.evict(cache) for _ in range(3)]
    assert order == [7, 0, 2], f"after reuse and free of block 2, evictions went {order}, expected [7, 0, 2]"
    assert not cache, f"names left after evicting every block: {sorted(cache)}"


@exercise("3.6")
def test_eviction_forgets_exactly_the_evicted_name(lab):
    """each eviction removes the evicted block's name from the cache and no other, so no name points at a
    reused block"""
    pool, cache = lab.EvictableBlocks(), {}
    chain = register(lab, tokens(611, 20), 4, cache, first_block=20)  # blocks 20..24, named in the cache
    held = lab.CachedBlock(9, 4242, (1, 2, 3, 4), None)  # named, but a sequence holds it: never evictable
    cache[held.hash] = held
    names = set(cache)
    for e in (chain[3], chain[0], chain[4]):
        pool.add(e)
    for e in (chain[3], chain[0], chain[4]):
        block = pool.evict(cache)
        assert block == e.block, f"evicted block {block}, the least recently used is {e.block}"
        assert all(x.block != block for x in cache.values()), \
            f"block {block} was evicted (its K/V are about to be overwritten) but a name still points at it"
        names.discard(e.hash)
        assert set(cache) == names, f"evicting block {block} removed the names of blocks that were not evicted"


@exercise("3.6")
def test_eviction_order_matches_minillm_on_a_random_trace(lab):
    """300 seeded random add / reuse / evict operations: the same evictable blocks, and the same evicted
    blocks in the same order, as minillm's EvictableBlocks"""
    rng, pool, oracle = random.Random(61), lab.EvictableBlocks(), reference.EvictableBlocks()
    cache, oracle_cache, named = {}, {}, {}  # named: block id -> its entry
    for step in range(300):
        idle = [b for b in range(12) if b not in oracle.entries]
        op = rng.random()
        if op < 0.45 and idle:
            b = rng.choice(idle)
            e = named[b] = lab.CachedBlock(b, chain_hash(None, (b, step)), (b, step), None)
            cache[e.hash] = oracle_cache[e.hash] = e
            pool.add(e)
            oracle.add(e)
        elif op < 0.7 and oracle.entries:
            b = rng.choice(list(oracle.entries))
            pool.reuse(b)
            oracle.reuse(b)
            if rng.random() < 0.6:  # the hit's sequence finishes soon: the block is evictable again, the newest
                pool.add(named[b])
                oracle.add(named[b])
        elif oracle.entries:
            expected, got = oracle.evict(oracle_cache), pool.evict(cache)
            assert got == expected, f"operation {step}: evicted block {got}, the least recently used is {expected}"
        assert set(pool.entries) == set(oracle.entries) and len(pool) == len(oracle), \
            (f"operation {step}: evictable blocks {sorted(pool.entries)} (len {len(pool)}), "
             f"expected {sorted(oracle.entries)}")
        assert set(cache) == set(oracle_cache), \
            f"operation {step}: names {sorted(cache)}, expected {sorted(oracle_cache)}"


@exercise("3.E", timeout=120)
def test_your_parts_run_the_real_engine(lab):
    """the real engine with your block allocator, prefix matcher and evictable blocks gives the reference
    engine's tokens, leaking no block"""
    with one_thread():
        check_against_reference(lab_components(lab, labs=["03"]))
