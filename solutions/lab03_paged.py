# %% [markdown]
# # Lab 03 · The paged KV cache and prefix caching
#
# **Time:** about 125 minutes in all, stated per section below. **You need:** lab 02 (a KV cache, the
# attention seam `ctx.attend`, and the prefill time per token).
#
# In lab 02 each sequence got its own cache of `max_len` positions, reserved up front. A server
# does not know how long an answer will be, so it must reserve for the longest possible one, and
# most of that memory is never written. KV memory is what limits how many requests run at once,
# so this waste directly costs throughput. **PagedAttention** (Kwon et al., 2023, the paper behind
# vLLM) borrows the operating system's answer to the same problem: cut memory into small fixed-size
# pages, *blocks*, and give each sequence a *block table* that says where its tokens live. A sequence
# takes a block only when it needs one, so its waste is at most its last, partly filled block.
#
# Once the cache lives in blocks, blocks can be **shared**: two requests that begin with the same
# system prompt can point at the same blocks, and the second one skips computing them. That is
# **prefix caching**, and it is the reason a chat turn with a long history can start answering fast.
#
# **See it run:** in the visualizer (`make app`), the **Paged memory explorer** page shows every sequence's
# block table, the shared blocks, and what the same requests would waste in a contiguous cache; the **Chat**
# page marks, turn by turn, the blocks of the conversation the prefix cache served. **Read more**, after the
# lab: `docs/engine.md`, its section "The KV cache" (the pool, the block size, prefix caching and preemption).
#
# ## Learning objectives
# By the end you can
# 1. allocate, grow, share and free KV blocks with reference counts, without leaking one;
# 2. map a token's position to its slot in the pool through a block table, and run attention
#    over K/V gathered from scattered blocks, matching contiguous attention exactly;
# 3. name a block by a hash chain over its prefix, find a cached prefix, and explain why a hit
#    must compare tokens and not trust the hash;
# 4. keep freed blocks findable and evict them least recently used first;
# 5. predict, then measure, the memory contiguous and paged allocation waste on SmolLM2-135M serving a
#    chat-shaped workload, and the time to first token a multi-turn chat saves with the prefix cache on.
#
# ## How this lab works
# Write code only in the exercise cells (they contain `raise NotImplementedError`), keeping names
# and signatures. Run each `check(...)` cell for feedback; `make grade LAB=03` grades the notebook.
# Each exercise is followed by hints in collapsed blocks: open them one at a time, only when stuck.
# `minillm/cache/block_manager.py` and `minillm/cache/paged.py` hold the engine's version of
# everything you build here: read them after you finish, not before.
#
# Three of your parts plug into the real engine, with the engine's own interfaces: the block
# allocator (3.1), the prefix matcher (3.5, which uses your 3.4) and the evictable blocks (3.6).
# The engine's `BlockManager` composes them, and the last check of the lab runs the engine on them.

# %% tags=["setup"]
import math
from collections import OrderedDict, deque

import torch
from torch import Tensor

from minillm.cache.prefix_cache import CachedBlock, chain_hash
from minillm.labkit import check
from minillm.layers.attention import causal_attention

# %%
import statistics

import plotly.graph_objects as go

from minillm import LLM, SamplingParams
from minillm.bench.memory import concurrency
from minillm.bench.synthetic_traffic import chat_workload
from minillm.cache.allocator import BlockAllocator

torch.set_num_threads(1)  # small model, small steps: one thread avoids thread-pool overhead

# %% [markdown]
# ## The concept: block tables (~10 min)
#
# The pool holds, for every layer, one big tensor of keys and one of values, each with one row per
# *slot* (one token's K or V), allocated once when the engine starts. The slots are cut into blocks of
# `block_size` consecutive slots: with blocks of 4, block 0 owns slots 0 to 3, block 1 slots 4 to 7,
# and so on. A sequence's block table lists its blocks in token order: its first `block_size` tokens
# live in the table's first block, the next ones in its second, and so on.
#
# ```
#  block_size = 4          sequence A: 10 tokens, table [5, 1, 6]    sequence B: 6 tokens, table [2, 7]
#
#  A's tokens  0  1  2  3 | 4  5  6  7 | 8  9  .  .        B's tokens  0  1  2  3 | 4  5  .  .
#              block 5    | block 1    | block 6                       block 2    | block 7
#
#  the pool    block: 0    1    2    3    4    5    6    7
#                     .    A    B    .    .    A    A    B       "." free
# ```
#
# Where is B's token 5? Tokens 0 to 3 fill B's first block (block 2), so token 5 is the second token
# of its second block, block 7. Block 7 owns slots 28 to 31, so token 5 is in slot 29.
#
# Blocks need not be adjacent or in order: the table is the only map. Each sequence wastes at
# most `block_size - 1` slots (its last block's empty tail). Here is a pool drawn by the engine's
# own `BlockAllocator`: four requests decoded side by side (so their blocks interleave), then B
# finished and E arrived:

# %%
manager = BlockAllocator(num_blocks=24, block_size=8)
lengths = {"A": 9, "B": 3, "C": 17, "D": 6}
tables = {name: manager.allocate(n) for name, n in lengths.items()}
for _ in range(14):  # they decode together, each growing by one token per step
    for name in tables:
        lengths[name] += 1
        manager.append(tables[name], lengths[name])
manager.free(tables.pop("B"))  # B finished: its blocks go back to the free list
del lengths["B"]
tables["E"], lengths["E"] = manager.allocate(20), 20
names = sorted(tables)
fill = [[math.nan] * 8 for _ in range(24)]  # [block, offset]: which request's token sits in the slot
for i, name in enumerate(names):
    for t in range(lengths[name]):
        fill[tables[name][t // 8]][t % 8] = i
for name in names:
    print(f"{name}: {lengths[name]:2d} tokens, block table {tables[name]}")
fig = go.Figure(go.Heatmap(z=[list(r) for r in zip(*fill)], x=list(range(24)), y=list(range(8)),
                           colorscale="Viridis", showscale=False, xgap=2, ygap=1,
                           text=[[names[int(v)] if v == v else "" for v in r] for r in zip(*fill)],
                           texttemplate="%{text}"))
fig.update_layout(title="The KV pool: blocks (columns) × slots (rows); empty cells are unused slots",
                  xaxis_title="block id", yaxis_title="offset in block", height=320, yaxis_autorange="reversed")
fig.show()

# %% [markdown]
# ## Exercise 3.1 · A block allocator with reference counts (~20 min)
#
# The allocator owns the free list and one reference count per block: how many holders the block
# has. A holder is a block table, or, in the engine, the prefix cache, which holds one reference
# of its own to each block it has named (from Exercise 3.4 on). Four operations:
#
# * `allocate(n)`: a new table with enough blocks for a prompt of `n` tokens, or `None` when the
#   pool has too few free blocks (and then nothing changes: a half-allocated request helps no one);
# * `append(table, n)`: the sequence now has `n` tokens; add a block if the last one is full;
# * `fork(table)`: a second table that *shares* every block (parallel samples of one prompt);
# * `free(table)`: drop this table's reference to each block; a block nobody references any more
#   goes back to the free list.
#
# How many blocks does a prompt need? With blocks of 16: 1 to 16 tokens take one block, 17 to 32 take
# two, 33 take three. Off-by-one errors at exactly these boundaries (16, 32) are the classic allocator
# bug. And a fork must hand back a table of its own: two samples that grow side by side each append
# to their own table.
#
# Writing into a block that another table shares needs *copy-on-write*. The engine's
# `BlockManager.append` does it with your operations: `allocate` a fresh block for the writer,
# `free` the writer's reference to the shared one (the other holders keep it), and copy the K/V
# across. So your allocator never copies anything itself; it only has to count right.

# %% exercise="3.1"
class BlockAllocator:
    """Hands out KV blocks of `block_size` token slots from a pool of `num_blocks`.

    free_blocks: the ids of unused blocks; ref_counts[b]: how many holders block b has (block
    tables, and in the engine the prefix cache). A block table is a list of block ids, in the
    order of its sequence's tokens.
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks, self.block_size = num_blocks, block_size
        self.free_blocks: deque[int] = deque(range(num_blocks))
        self.ref_counts = [0] * num_blocks

    @property
    def num_free(self) -> int:
        return len(self.free_blocks)

    def blocks_for(self, num_tokens: int) -> int:
        """The fewest blocks that hold num_tokens tokens (num_tokens >= 0; 0 tokens take 0 blocks).

        -> an int, computed exactly in integer arithmetic (no float rounding at any size).
        """
        ### BEGIN SOLUTION
        return -(-num_tokens // self.block_size)
        ### END SOLUTION

    def allocate(self, num_tokens: int) -> list[int] | None:
        """A new block table holding num_tokens tokens, its blocks taken from the free list (each
        one's ref count becomes 1). -> the table, or None, with nothing changed, if the pool has too
        few free blocks (a half-allocated request helps no one).
        """
        ### BEGIN SOLUTION
        needed = self.blocks_for(num_tokens)
        if needed > self.num_free:
            return None
        table = [self.free_blocks.popleft() for _ in range(needed)]
        for b in table:
            self.ref_counts[b] = 1
        return table
        ### END SOLUTION

    def append(self, table: list[int], num_tokens: int) -> bool:
        """Grow `table` in place so that it holds num_tokens tokens (its sequence grew; num_tokens is
        at least what the table held before). -> True, or False with the table and the pool unchanged
        if the pool has too few free blocks. New blocks start with a ref count of 1.
        """
        ### BEGIN SOLUTION
        needed = self.blocks_for(num_tokens) - len(table)
        if needed > self.num_free:
            return False
        for _ in range(needed):
            b = self.free_blocks.popleft()
            self.ref_counts[b] = 1
            table.append(b)
        return True
        ### END SOLUTION

    def fork(self, table: list[int]) -> list[int]:
        """A second table sharing every block of `table`, in the same order, for a second holder
        (a parallel sample of the same prompt). -> a new list, not `table` itself; the blocks' ref
        counts account for the new holder. No block is taken from the free list.
        """
        ### BEGIN SOLUTION
        for b in table:
            self.ref_counts[b] += 1
        return list(table)
        ### END SOLUTION

    def free(self, table: list[int]) -> None:
        """This table stops holding its blocks. A block that no holder holds any more goes back to
        the free list; a block someone else still holds stays out of it. Empties `table` in place
        (it holds nothing any more).
        """
        ### BEGIN SOLUTION
        for b in table:
            self.ref_counts[b] -= 1
            if self.ref_counts[b] == 0:
                self.free_blocks.append(b)
        table.clear()
        ### END SOLUTION


# %% [markdown]
# <details><summary>Hint 1: a nudge</summary>
#
# Write `blocks_for` first and test it by hand at 0, 1, 16, 17 with blocks of 16. Then every operation
# keeps one promise: each block's ref count equals the number of holders, and a block is on the free
# list exactly when its count is 0.
#
# </details>
# <details><summary>Hint 2: the idea</summary>
#
# `blocks_for` is a division that rounds up, written with integer operations only. `allocate` and
# `append` check the free list *before* taking anything, so a refusal leaves everything as it was.
# `append` needs only the blocks the table does not have yet. `fork` counts one more holder per block
# and returns a copy; `free` counts one fewer and returns a block to the free list only at zero.
#
# </details>
# <details><summary>Hint 3: the last resort</summary>
#
# Rounding up with integers: the negation of the floor division of the negated count, or
# (n + block_size - 1) floor-divided by block_size.
#
# </details>

# %%
check("3.1")

# %% [markdown]
# ## Exercise 3.2 · Slot mapping (~10 min)
#
# Before a step runs, the runner tells every attention layer where each new token's K and V go:
# one *slot* per token, the slot you found for B's token 5 in the drawing above. The layer then
# writes all the new keys with a single indexed store into its pool, whatever the blocks' order in
# the pool. The same mapping over a sequence's whole context, position 0 onwards, lists the slots of
# its context in order: that is how attention *reads* a paged cache (3.3).
#
# Work one more by hand before you write it: blocks of 8, table `[3, 0, 5]`, position 17. Which entry
# of the table, which offset in the block, which slot? (Answer: the third entry, block 5; offset 1;
# slot 41.)

# %% exercise="3.2"
def slot_mapping(block_table: list[int], start: int, end: int, block_size: int) -> Tensor:
    """The pool slots of a sequence's positions from start (included) to end (excluded).

    block_table: the sequence's block ids, enough of them to hold every position asked for;
    0 <= start <= end.
    -> int64 tensor of one slot per position, in position order (empty when start == end).
    """
    ### BEGIN SOLUTION
    t = torch.arange(start, end)
    table = torch.tensor(block_table, dtype=torch.long)
    return table[t // block_size] * block_size + t % block_size
    ### END SOLUTION


# %% [markdown]
# <details><summary>Hint 1: a nudge</summary>
#
# Do the hand example for one position, then ask which tensor operations do the same for all positions
# at once: a range of positions, then two integer operations on it, then indexing the table.
#
# </details>
# <details><summary>Hint 2: the idea</summary>
#
# A position's block is found by integer division by the block size (an index into the table), and its
# offset inside the block by the remainder. A block's first slot is its id times the block size. Turn
# the table into an int64 tensor so you can index it with a tensor of entries.
#
# </details>

# %%
check("3.2")
print(slot_mapping([5, 1, 6], 0, 10, 4).tolist())  # sequence A of the drawing above

# %% [markdown]
# ## Exercise 3.3 · Attention through a block table (~10 min)
#
# `k_cache` and `v_cache` are one layer's pool, `[num_slots, kv_heads, head_dim]`. A sequence's
# keys sit in the slots its block table names: gather them in position order, and attention is the
# same formula as in lab 02. This is the PyTorch reference of PagedAttention; a real kernel (lab 07)
# reads the blocks in place instead of copying them out, but computes the same numbers.
#
# The queries are the sequence's last `n` positions (a prefill chunk, or `n = 1` for decode), whose
# K/V the layer has already written into the pool.

# %% exercise="3.3"
def paged_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, block_table: list[int],
                    context_len: int, block_size: int) -> Tensor:
    """Causal attention of a sequence's last n tokens over its whole context, read from the pool
    through its block table: the same numbers as lab 02's attention over a contiguous cache.

    q: [n, heads, head_dim], the queries of the context's last n positions (n <= context_len);
    k_cache, v_cache: [num_slots, kv_heads, head_dim], one layer's pool, already holding the K/V of all
    context_len positions -> [n, heads, head_dim]. The pool is only read, never written.
    """
    ### BEGIN SOLUTION
    slots = slot_mapping(block_table, 0, context_len, block_size)  # [context_len]
    return causal_attention(q, k_cache[slots], v_cache[slots])
    ### END SOLUTION


# %% [markdown]
# <details><summary>Hint 1: a nudge</summary>
#
# You already have both halves: a function that says where a sequence's tokens are, and an attention
# that takes keys and values in position order.
#
# </details>
# <details><summary>Hint 2: the idea</summary>
#
# Map the whole context (from position 0) to slots with your 3.2, gather those rows of the key and value
# pools, and hand them to the same causal attention lab 02 used.
#
# </details>

# %%
check("3.3")

# %% [markdown]
# ## Prefix caching: naming a block by its whole prefix (~15 min, with 3.4)
#
# A block's K/V depend on its own tokens *and on every token before it* (attention mixed them in).
# So a block can be reused only by a sequence with the same tokens in the same block **and** the
# same prefix before it. Hashing a block's tokens alone would give two blocks with the same tokens
# after different prefixes the same name: wrong. Hashing the whole prefix for every block would be
# right, but costs O(n) per block. A *hash chain* gets the first property at the second's price: each
# block's name is made from the name of the block before it and its own tokens, so a name stands for
# everything up to its block. The hash function is given (`hash_fn(parent_name, tokens)`, the engine's
# `chain_hash`; the first block has no parent, `None`): the chaining is yours.
#
# The engine keeps a dictionary from names to cached blocks. A new prompt computes its chain and
# walks it from the start; every name found is a block whose K/V need no computing. Only full
# blocks get names: a partly filled block still changes.
#
# Each dictionary entry is a `CachedBlock` (imported from `minillm.cache.prefix_cache` in the setup
# cell, so you work on the engine's own objects): `block` (its id in the pool), `hash` (its name),
# `tokens` (the `block_size` token ids it holds, a tuple) and `parent` (the entry of the block
# before it, `None` for a first block). When the engine names a block, the prefix cache takes a
# reference of its own to it (your `fork` of that one block), so the block outlives the sequence
# that computed it.

# %% exercise="3.4"
def block_hashes(token_ids: list[int], block_size: int, hash_fn=chain_hash) -> list[int]:
    """The names of the full blocks of token_ids, in order (a last, partial block gets none).

    hash_fn(parent name or None, block's tokens as a tuple of ints) -> int is the only hash used; a
    block's name must stand for its own tokens and every token before it, as the engine's do.
    -> list of ints, one per full block (empty when there is none).
    """
    ### BEGIN SOLUTION
    hashes, parent = [], None
    for i in range(len(token_ids) // block_size):
        parent = hash_fn(parent, tuple(token_ids[i * block_size:(i + 1) * block_size]))
        hashes.append(parent)
    return hashes
    ### END SOLUTION


# %% [markdown]
# <details><summary>Hint 1: a nudge</summary>
#
# How many full blocks are there? Which name does the first block's `hash_fn` call get as its parent,
# and which does the second's get?
#
# </details>
# <details><summary>Hint 2: the idea</summary>
#
# Walk the full blocks in order, carrying the last name you made: each block's name is `hash_fn` of that
# carried name (None at the start) and the block's tokens as a tuple; the new name becomes the carried one.
#
# </details>

# %%
check("3.4")
system = list(range(100, 124))  # a shared 24-token "system prompt", then two different questions
for question in ([7, 8, 9, 10, 11, 12, 13, 14], [7, 8, 9, 10, 99, 98, 97, 96]):
    print([h % 10_000 for h in block_hashes(system + question, 8)])

# %% [markdown]
# ## Exercise 3.5 · Finding a cached prefix, safely (~15 min)
#
# A hash is a name, not a proof. Two different prefixes can collide on the same name (with
# Python's 64-bit `hash` that is rare; with an adversary choosing prompts it need not be), and a
# collision must never hand a request someone else's K/V: that would be a silent wrong answer and
# a leak of another user's prompt. So every hit is *verified*: the cached entry must hold the same
# tokens, and its parent must be the entry matched just before (the very same object, compared
# with `is`). By induction, a verified chain of entries holds exactly this prompt's prefix.
#
# One more rule: the prompt's last token is always computed, because its logits give the first
# output token. So only full blocks that end before the last token may hit. With blocks of 4: a prompt
# of 9 tokens has two full blocks before its last token, and both may hit; a prompt of exactly 8 has
# two full blocks too, but the second one holds the last token, so only the first may.

# %% exercise="3.5"
def match_prefix(token_ids: list[int], block_size: int, cache: dict[int, CachedBlock],
                 hash_fn=chain_hash) -> list[CachedBlock]:
    """The longest verified run of cached blocks at the start of a prompt.

    cache: name -> CachedBlock, names made with hash_fn as block_hashes makes them; only read.
    Rules: the prompt's last token is never matched; a block is matched only if every block before it
    was; an entry counts only if it holds this block's tokens and its parent is the very entry matched
    for the block before (None for the first block). -> the matched entries, in prompt order (empty on
    no hit).
    """
    ### BEGIN SOLUTION
    matched, parent = [], None
    for i, h in enumerate(block_hashes(token_ids[:-1], block_size, hash_fn)):
        entry = cache.get(h)
        tokens = tuple(token_ids[i * block_size:(i + 1) * block_size])
        if entry is None or entry.tokens != tokens or entry.parent is not parent:
            break
        matched.append(entry)
        parent = entry
    return matched
    ### END SOLUTION


# %% [markdown]
# <details><summary>Hint 1: a nudge</summary>
#
# Your 3.4 already names the blocks. Which tokens should you name, so that the last token can never be
# in a matched block?
#
# </details>
# <details><summary>Hint 2: the idea</summary>
#
# Name the full blocks of the prompt without its last token, then walk those names from the first,
# carrying the entry matched last (None at the start). Look each name up; stop at the first that is
# absent, holds other tokens, or has another parent object than the carried one.
#
# </details>

# %%
check("3.5")

# %% [markdown]
# ## Exercise 3.6 · Keeping freed blocks, evicting the least recently used (~10 min)
#
# When a request finishes, its cached blocks still hold valid K/V. Throwing them away would waste
# the next hit. They do not go back to the free list: the prefix cache still holds its own
# reference to each, so when the last table frees one its count drops to 1, not 0. The engine's
# `BlockManager` then `add`s it to the **evictable** blocks: no table holds it, but the cache
# still finds it. A prefix hit takes it back into use (`reuse`). Only when the free list runs dry
# does the engine *evict* one: your `evict` picks the **least recently used** (LRU) and removes its
# name from the cache (its slots are about to be overwritten); the engine then drops the prefix
# cache's reference with your allocator's `free`, which puts the block back on the free list.
#
# An `OrderedDict` keeps insertion order and can take entries out of either end in O(1). A worked
# example of the order: blocks 4, 9 and 2 are freed in that order, then a hit reuses 9, and later 9
# is freed again. The least recently used is now 4, then 2, then 9.

# %% exercise="3.6"
class EvictableBlocks:
    """Cached blocks that no block table holds, least recently used first.

    entries: OrderedDict block id -> CachedBlock, oldest first.
    """

    def __init__(self) -> None:
        self.entries: OrderedDict[int, CachedBlock] = OrderedDict()

    def __len__(self) -> int:
        return len(self.entries)

    def add(self, entry: CachedBlock) -> None:
        """The last table holding entry.block freed it: it becomes the most recently used evictable block.
        """
        ### BEGIN SOLUTION
        self.entries[entry.block] = entry
        ### END SOLUTION

    def reuse(self, block: int) -> None:
        """A prefix hit takes `block` (an evictable one) back into use: it is no longer evictable, and
        stays cached: its name stays in the engine's dictionary.
        """
        ### BEGIN SOLUTION
        del self.entries[block]
        ### END SOLUTION

    def evict(self, cache: dict[int, CachedBlock]) -> int:
        """Take the least recently used evictable block for new K/V (at least one is evictable). It
        leaves the entries, and its name leaves `cache` (its contents are about to be overwritten; no
        other name goes). -> its block id.
        """
        ### BEGIN SOLUTION
        block, entry = self.entries.popitem(last=False)
        del cache[entry.hash]
        return block
        ### END SOLUTION


# %% [markdown]
# <details><summary>Hint 1: a nudge</summary>
#
# Decide which end of `entries` is "least recently used", given how `add` puts blocks in. Then the
# three methods are each one or two operations on the dictionary.
#
# </details>
# <details><summary>Hint 2: the idea</summary>
#
# `add` puts the block at the most recent end; `reuse` removes it wherever it is; `evict` takes from the
# oldest end, and uses the entry's own name to delete it from `cache`. OrderedDict's documentation lists
# the method that takes an item from either end.
#
# </details>

# %%
check("3.6")

# %% [markdown]
# ## Your parts in the real engine (~2 min)
#
# Your `BlockAllocator`, `match_prefix` and `EvictableBlocks` have the interfaces of
# `minillm.cache.allocator` and `minillm.cache.prefix_cache`, so the engine's `BlockManager` can run on
# them (`minillm.labkit.plug.plug("lab03_paged.ipynb")` builds such an engine). The check below
# runs a workload that makes it use all of them at once: a small pool, so requests are preempted
# and blocks evicted; a shared system prompt, so prefixes hit; two samples per request, so blocks
# are shared and copied on write. The tokens must be the reference engine's, and when every request
# has finished no block may still be held.

# %%
check("3.E")

# %% [markdown]
# ## Predict: how much memory does each layout waste? (~10 min)
#
# The main experiments run on SmolLM2-135M-Instruct, a real instruct model; the next cell prints what one
# token's K/V cost it and how long a context it takes. The requests are a chat-shaped workload: prompt and
# output lengths drawn log-normal, with a heavy right tail, the shape of public chat traces such as
# ShareGPT (`minillm.bench.synthetic_traffic.chat_workload`; the cell prints its medians). A server runs
# 16 requests at a time, each growing by one token per step, a new request starting whenever one
# finishes. At every step, count the token slots each layout *reserves*:
#
# * **contiguous, max length**: every request reserves the model's whole context, what early servers did;
# * **contiguous, prompt + max_tokens**: every request reserves its prompt plus the longest answer it may
#   give, the best a contiguous cache can do without knowing the future;
# * **paged**: your `BlockAllocator`, growing each request one block at a time.
#
# The waste is the share of the reserved slots, summed over the steps, that never hold a token. Work it
# out for one *typical* request first; on other numbers, to see how: a 100-token prompt, a 60-token
# answer and a `max_tokens` of 300. During its life it holds 100 to 160 tokens, about 130 on average,
# and reserves 400 all along: it wastes about 1 - 130/400, 68%. Paged with blocks of 8, its last block
# is on average about half empty: some 4 empty slots beside about 130 held, 3%.
#
# Predict both figures for this workload's median request, printed below (the prompt + max_tokens layout,
# and the paged one with blocks of 16), then run the replay.

# %%
from minillm.labkit import REAL_MODEL, compare, quick_run, real_model_installed

MODEL = REAL_MODEL if real_model_installed() else "tiny"  # without SmolLM2 installed, the bundled model stands in
real = LLM(MODEL)
real_cfg = real.model.config
kv_per_token = real_cfg.kv_bytes_per_token(4)  # float32 K and V, all layers
workload = chat_workload(120 if quick_run() else 400, seed=0, max_output=512)
MAX_MODEL_LEN, BATCH, MAX_TOKENS = real_cfg.max_position_embeddings, 16, workload[0].max_tokens
median_prompt = statistics.median(r.prompt_len for r in workload)
median_output = statistics.median(r.output_len for r in workload)
print(f"{MODEL}: {kv_per_token / 1e3:.1f} kB of K/V per token (float32), a context of {MAX_MODEL_LEN} tokens")
print(f"{len(workload)} requests: median prompt {median_prompt:.0f} tokens, median answer {median_output:.0f}, "
      f"max_tokens {MAX_TOKENS}; the longest prompt {max(r.prompt_len for r in workload)}, "
      f"the longest answer {max(r.output_len for r in workload)}")

# %%
MY_PREDICTION_CONTIGUOUS = None  # %: the prompt + max_tokens layout's waste, for the median request above
MY_PREDICTION_PAGED = None  # %: the paged layout's waste with blocks of 16, for the median request above

# %% [markdown]
# ## Measure: the waste of each layout (~5 min)

# %%
def replay(block_size: int) -> dict[str, list[int]]:
    """Step by step: tokens stored and slots reserved by each layout."""
    allocator = BlockAllocator(num_blocks=BATCH * MAX_MODEL_LEN, block_size=block_size)
    queue, running = list(workload), []  # running: [request, block table, tokens so far]
    trace = {"stored": [], "paged": [], "prompt + max_tokens": [], "max length": []}
    while queue or running:
        while queue and len(running) < BATCH:
            r = queue.pop(0)
            running.append([r, allocator.allocate(r.prompt_len), r.prompt_len])
        for item in running:  # one decode step: every request grows by one token
            item[2] += 1
            assert allocator.append(item[1], item[2])
        trace["stored"].append(sum(n for _, _, n in running))
        trace["paged"].append(sum(len(t) for _, t, _ in running) * block_size)
        trace["prompt + max_tokens"].append(sum(r.prompt_len + r.max_tokens for r, _, _ in running))
        trace["max length"].append(len(running) * MAX_MODEL_LEN)
        for item in [i for i in running if i[2] >= i[0].prompt_len + i[0].output_len]:
            allocator.free(item[1])
            running.remove(item)
    assert allocator.num_free == allocator.num_blocks, "blocks leaked"
    return trace


def waste_of(trace: dict[str, list[int]], layout: str) -> float:
    return 1 - sum(trace["stored"]) / sum(trace[layout])


trace = replay(block_size=16)
fig = go.Figure([go.Scatter(y=[n * kv_per_token / 1e6 for n in v], name=k, mode="lines") for k, v in trace.items()])
fig.update_layout(title=f"KV memory held while serving {len(workload)} chat requests, {BATCH} at a time, on {MODEL}",
                  xaxis_title="decode step", yaxis_title="MB of K/V (float32)", yaxis_type="log", height=380)
fig.show()
for name in ("max length", "prompt + max_tokens", "paged"):
    print(f"{name:>20}: {waste_of(trace, name):6.1%} of reserved slots never hold a token; "
          f"at the peak {max(trace[name]) * kv_per_token / 1e6:7.0f} MB reserved")
held = median_prompt + (median_output + 1) / 2  # the median request's mean tokens held over its life
compare("waste, contiguous prompt + max_tokens", MY_PREDICTION_CONTIGUOUS,
        theory=100 * (1 - held / (median_prompt + MAX_TOKENS)), measured=100 * waste_of(trace, "prompt + max_tokens"),
        unit="%", theory_name="median request",
        gap="the median request is not the average slot: long answers hold their reservation longest and fill "
            "most of it, so they weigh most in the sum over steps, and the tail pulls the waste away from the "
            "median request's figure.")
compare("waste, paged (blocks of 16)", MY_PREDICTION_PAGED, theory=100 * 7.5 / (held + 7.5),
        measured=100 * waste_of(trace, "paged"), unit="%", theory_name="half a block",
        gap="a request's last block is on average half empty (7.5 of 16 slots); the gap is the spread of the "
            "lengths around the median request.")

# %% [markdown]
# The PagedAttention paper (Kwon et al., 2023, section 1) found that existing systems kept token states in
# only 20.4–38.2% of the KV memory they reserved, that is 62–80% waste; the figures printed above are this
# workload's, on this model's context and the `max_tokens` it allows. How close the contiguous layouts come
# to the paper's range depends on how far `max_tokens` and the context are above what requests use.
# Paged allocation wastes only the tail of each request's last block. The block size trades that waste
# against bookkeeping: bigger blocks mean shorter tables and longer contiguous reads for the kernel, but
# more empty slots at the end.

# %%
block_sizes = [1, 4, 16, 64, 256]
waste = [waste_of(replay(bs), "paged") for bs in block_sizes]
fig = go.Figure(go.Bar(x=[str(b) for b in block_sizes], y=[w * 100 for w in waste],
                       text=[f"{w:.1%}" for w in waste], textposition="outside"))
fig.update_layout(title="Paged: share of reserved slots that are empty, by block size",
                  xaxis_title="block size (tokens)", yaxis_title="waste (%)", height=340)
fig.show()

# %% [markdown]
# Waste matters because it decides **how many requests fit at once** in a fixed pool, and so the
# batch size and the throughput. `minillm.bench.memory.concurrency` admits requests first come,
# first served into a pool of 1 GiB of K/V and counts how many run at once while the queue is full:

# %%
pool = 2**30 // kv_per_token
fits = {"max length": concurrency(workload, pool, 16, lambda r: MAX_MODEL_LEN),
        "prompt + max_tokens": concurrency(workload, pool, 16, lambda r: r.prompt_len + r.max_tokens),
        "paged, block 16": concurrency(workload, pool, 16)}
print(f"a pool of 1 GiB holds {pool} tokens of {MODEL}'s K/V")
for name, n in fits.items():
    print(f"{name:>20}: {n:5.1f} requests at once")

# %% [markdown]
# ## Predict: what a multi-turn chat saves with the prefix cache (~10 min)
#
# A chat model remembers nothing between requests: every turn sends the whole conversation again, the
# system message, each earlier question and answer, then the new question. Without a prefix cache each
# turn's prefill computes all of it; with one, the blocks of the earlier turns are still in the pool, and
# the prefill computes only what is new. The engine finds whole blocks (16 tokens here) only, and always
# computes the prompt's last token (3.5).
#
# So the TTFT a turn saves should be about its cached tokens times the prefill time per token. The next
# cell measures that time on this machine (a fresh prompt, with nothing to find), and prints the
# conversation's sizes: work out how many tokens the last turn can find cached, and predict what it saves.

# %%
off = LLM(MODEL, weights=real.model, enable_prefix_caching=False)  # the same weights, no prefix cache
torch.manual_seed(0)
probe = torch.randint(1, real_cfg.vocab_size, (256,)).tolist()
first_token = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
off.generate([probe[:32]], first_token, use_tqdm=False)  # warm-up
for warm_up in (probe[-48:], probe[-48:] + probe[:8]):  # warm-ups, the second a prefix hit (its first costs more)
    real.generate([warm_up], first_token, use_tqdm=False)
per_token = statistics.median(off.generate([probe], first_token, use_tqdm=False)[0].metrics["ttft"]
                              for _ in range(1 if quick_run() else 3)) / len(probe)
SYSTEM = ("You are a patient tutor for a course on how language models are served. Answer in two or three "
          "short sentences, use plain words, define any term you use, and give one concrete number where it "
          "helps. When the learner is wrong, say so kindly and show why. Never invent a source; if you are "
          "not sure, say that you are not sure.")
QUESTIONS = ["What is a KV cache?", "Why does decoding one token at a time read all the weights?",
             "What does a block table store?", "Why must a prefix cache compare tokens, not only hashes?",
             "What is time to first token?", "How does a prefix cache change it in a chat?"]
turns = 3 if quick_run() else len(QUESTIONS)
answer = SamplingParams(max_tokens=12 if quick_run() else 48, temperature=0)
system_tokens = len(real.tokenizer.encode(SYSTEM))
print(f"prefill here: {per_token * 1e3:.2f} ms per token (a {len(probe)}-token prompt, nothing cached)")
question_tokens = [len(real.tokenizer.encode(q)) for q in QUESTIONS[:turns]]
print(f"the conversation: a system message of {system_tokens} tokens, {turns} questions of {question_tokens} tokens, "
      f"answers of at most {answer.max_tokens} tokens, blocks of {real.config.cache.block_size}")

# %%
MY_PREDICTION = None  # ms: the TTFT the prefix cache saves at the last turn (cached tokens × time per token)

# %% [markdown]
# ## Measure: TTFT of a multi-turn chat, prefix cache on and off (~5 min)
#
# The cell below runs the conversation turn by turn on the engine with the prefix cache, and sends each
# turn's very same prompt to the engine without it. It keeps the answers greedy, so both engines must
# give the same tokens: reuse must not change a single one.

# %%
messages, rows, same = [{"role": "system", "content": SYSTEM}], [], True
for question in QUESTIONS[:turns]:
    messages.append({"role": "user", "content": question})
    on_out = real.chat(messages, answer, use_tqdm=False)[0]
    off_out = off.chat(messages, answer, use_tqdm=False)[0]
    same = same and on_out.token_ids == off_out.token_ids
    rows.append((len(on_out.prompt_token_ids), on_out.metrics["cached_prompt_tokens"],
                 off_out.metrics["ttft"] * 1e3, on_out.metrics["ttft"] * 1e3))
    messages.append({"role": "assistant", "content": on_out.text})
print("turn  prompt  cached  TTFT off ms  TTFT on ms  saved ms  cached × per-token ms")
for i, (n, cached, t_off, t_on) in enumerate(rows, 1):
    print(f"{i:4d}  {n:6d}  {cached:6d}  {t_off:11.1f}  {t_on:10.1f}  {t_off - t_on:8.1f}  "
          f"{cached * per_token * 1e3:9.1f}")
print("answers identical with and without prefix caching:", same)
numbers = list(range(1, turns + 1))
fig = go.Figure([go.Scatter(x=numbers, y=[r[2] for r in rows], mode="lines+markers", name="cache off"),
                 go.Scatter(x=numbers, y=[r[3] for r in rows], mode="lines+markers", name="cache on"),
                 go.Scatter(x=numbers, y=[r[2] - r[1] * per_token * 1e3 for r in rows],
                            mode="lines", line_dash="dot", name="off − cached × per-token time")])
fig.update_layout(title=f"Time to first token, turn by turn, {MODEL}", xaxis_title="turn",
                  yaxis_title="TTFT (ms)", height=340)
fig.show()
n, cached, t_off, t_on = rows[-1]
compare(f"TTFT saved at turn {turns} ({cached} of {n} prompt tokens cached)", MY_PREDICTION,
        theory=cached * per_token * 1e3, measured=t_off - t_on, unit="ms", theory_name="cached × per-token",
        gap="the per-token time was measured on a prompt of another length (attention grows with the context), "
            "the chat template adds tokens of its own around each message, and a step's fixed costs are paid "
            "with the cache or without it; the rest is a shared machine's noise (one turn can be far off: "
            "run the cell again).")

# %% [markdown]
# ## How production engines do it (~5 min)
#
# * **vLLM** introduced PagedAttention: a block table per sequence, a block size of 16 by default,
#   reference counts, and copy-on-write when a shared block is written (parallel sampling, beam
#   search). Its attention kernels read K/V through the block table in place; FlashAttention and
#   FlashInfer both ship paged variants.
# * **Automatic prefix caching** in vLLM names each full block by hashing its parent block's hash,
#   its tokens and extra keys (a LoRA adapter, image inputs, a cache salt per tenant), keeps freed
#   blocks in an LRU free queue, and frees a sequence's blocks tail first so that shared heads
#   stay longest. Recent versions name blocks with a cryptographic hash (SHA-256), which makes a
#   collision practically impossible, even for prompts chosen by an adversary.
# * **SGLang's RadixAttention** stores cached prefixes in a radix tree keyed by the token ids
#   themselves: matching walks the tree and compares tokens, so there is nothing to collide, and
#   eviction removes least recently used *leaves*. Its scheduler can order waiting requests to
#   maximise prefix hits (cache-aware scheduling).
# * **Beyond one GPU's memory**: engines offload cold blocks to CPU memory or disk (vLLM's KV
#   connectors, LMCache) and route requests to the replica that already holds their prefix
#   (coming in lab 09).
