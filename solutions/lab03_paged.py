# %% [markdown]
# # Lab 03 · The paged KV cache and prefix caching
#
# **Time:** about 100 minutes. **You need:** lab 02 (a KV cache and the attention seam `ctx.attend`).
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
# ## Learning objectives
# By the end you can
# 1. allocate, grow, share and free KV blocks with reference counts, without leaking one;
# 2. map a token's position to its slot in the pool through a block table, and run attention
#    over K/V gathered from scattered blocks, matching contiguous attention exactly;
# 3. name a block by a hash chain over its prefix, find a cached prefix, and explain why a hit
#    must compare tokens and not trust the hash;
# 4. keep freed blocks findable and evict them least recently used first;
# 5. measure the memory contiguous and paged allocation waste on a chat-like workload, and what a
#    prefix-cache hit does to time to first token on a real engine.
#
# ## How this lab works
# Write code only in the exercise cells (they contain `raise NotImplementedError`), keeping names
# and signatures. Run each `check(...)` cell for feedback; `make grade LAB=03` grades the notebook.
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
# ## The concept: block tables
#
# The pool holds, for every layer, one big tensor of keys and one of values, each
# `[num_blocks * block_size, kv_heads, head_dim]`, allocated once when the engine starts.
# A *slot* is one token's row in it; block `b` owns slots
# `b * block_size .. b * block_size + block_size - 1`. A sequence's block table lists its blocks in
# token order, so token `t` lives in block `table[t // block_size]` at offset `t % block_size`:
#
# ```
#  block_size = 4          sequence A: 10 tokens, table [5, 1, 6]    sequence B: 6 tokens, table [2, 7]
#
#  A's tokens  0  1  2  3 | 4  5  6  7 | 8  9  .  .        B's tokens  0  1  2  3 | 4  5  .  .
#              block 5    | block 1    | block 6                       block 2    | block 7
#
#  the pool    block: 0    1    2    3    4    5    6    7
#                     .    A    B    .    .    A    A    B       "." free;  A's token 9 is in slot 6*4 + 1 = 25
# ```
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
# ## Exercise 3.1 · A block allocator with reference counts
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
# The block count is `ceil(n / block_size)`: 16 tokens fit in one block of 16, the 17th needs a
# second one. Off-by-one errors at exactly this boundary are the classic allocator bug.
#
# Writing into a block that another table shares needs *copy-on-write*. The engine's
# `BlockManager.append` does it with your operations: `allocate` a fresh block for the writer,
# `free` the writer's reference to the shared one (the other holders keep it), and copy the K/V
# across. So your allocator never copies anything itself; it only has to count right.

# %% exercise="3.1"
class BlockAllocator:
    """Hands out KV blocks of `block_size` token slots from a pool of `num_blocks`.

    free_blocks: the ids of unused blocks; ref_counts[b]: how many holders block b has (block
    tables, and in the engine the prefix cache). A block table is a list of block ids: token t of
    its sequence is in block table[t // block_size].
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks, self.block_size = num_blocks, block_size
        self.free_blocks: deque[int] = deque(range(num_blocks))
        self.ref_counts = [0] * num_blocks

    @property
    def num_free(self) -> int:
        return len(self.free_blocks)

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks that hold num_tokens tokens: ceil(num_tokens / block_size).

        Hints: 1 line, in integer arithmetic.
        """
        ### BEGIN SOLUTION
        return -(-num_tokens // self.block_size)
        ### END SOLUTION

    def allocate(self, num_tokens: int) -> list[int] | None:
        """A new block table holding num_tokens tokens (each block's ref count becomes 1),
        or None, with nothing changed, if fewer than blocks_for(num_tokens) blocks are free.

        Hints: 5 lines. `self.free_blocks.popleft()`.
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
        """Grow `table` in place so that it holds num_tokens tokens (its sequence grew).
        -> True, or False with the table unchanged if the pool has too few free blocks.

        Hints: 6 lines. Only blocks_for(num_tokens) - len(table) new blocks are needed.
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
        """A new table sharing every block of `table`: each block's ref count goes up by one.

        Hints: 3 lines.
        """
        ### BEGIN SOLUTION
        for b in table:
            self.ref_counts[b] += 1
        return list(table)
        ### END SOLUTION

    def free(self, table: list[int]) -> None:
        """Drop this table's reference to each of its blocks; a block whose ref count reaches 0
        goes back to the free list. Empties `table` (it holds nothing any more).

        Hints: 5 lines. `self.free_blocks.append(b)`, `table.clear()`.
        """
        ### BEGIN SOLUTION
        for b in table:
            self.ref_counts[b] -= 1
            if self.ref_counts[b] == 0:
                self.free_blocks.append(b)
        table.clear()
        ### END SOLUTION


# %%
check("3.1")

# %% [markdown]
# ## Exercise 3.2 · Slot mapping
#
# Before a step runs, the runner tells every attention layer where each new token's K and V go:
# one *slot* per token, `slot = table[t // block_size] * block_size + t % block_size` for position
# `t`. The layer then writes `k_cache[slot_mapping] = k` in a single indexed store, whatever the
# blocks' order in the pool. The same mapping over positions `0 .. length - 1` lists the slots of
# a sequence's whole context, in order: that is how attention *reads* a paged cache (3.3).

# %% exercise="3.2"
def slot_mapping(block_table: list[int], start: int, end: int, block_size: int) -> Tensor:
    """The pool slots of positions start .. end - 1 of a sequence.

    -> [end - start] int64, slot[i] = block_table[t // block_size] * block_size + t % block_size
       with t = start + i.

    Hints: 3 lines. `torch.arange(start, end)`, index a `torch.tensor(block_table)` with `t // block_size`.
    """
    ### BEGIN SOLUTION
    t = torch.arange(start, end)
    table = torch.tensor(block_table, dtype=torch.long)
    return table[t // block_size] * block_size + t % block_size
    ### END SOLUTION


# %%
check("3.2")
print(slot_mapping([5, 1, 6], 0, 10, 4).tolist())  # sequence A of the drawing above

# %% [markdown]
# ## Exercise 3.3 · Attention through a block table
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
    """Causal attention of a sequence's last n tokens over its first context_len tokens, read
    from the pool through its block table.

    q: [n, heads, head_dim] (positions context_len - n .. context_len - 1);
    k_cache, v_cache: [num_slots, kv_heads, head_dim] -> [n, heads, head_dim]
    keys = k_cache[slots of positions 0 .. context_len - 1], likewise values; then causal attention.

    Hints: 2 lines. `slot_mapping`, `causal_attention(q, keys, values)`.
    """
    ### BEGIN SOLUTION
    slots = slot_mapping(block_table, 0, context_len, block_size)  # [context_len]
    return causal_attention(q, k_cache[slots], v_cache[slots])
    ### END SOLUTION


# %%
check("3.3")

# %% [markdown]
# ## Prefix caching: naming a block by its whole prefix
#
# A block's K/V depend on its own tokens *and on every token before it* (attention mixed them in).
# So a block can be reused only by a sequence with the same tokens in the same block **and** the
# same prefix before it. A *hash chain* gives each full block a name that stands for its whole prefix:
#
# `h_0 = hash(None, tokens of block 0)`,   `h_i = hash(h_{i-1}, tokens of block i)`.
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
    """The hash chain of the full blocks of token_ids (a last, partial block gets none).

    -> [len(token_ids) // block_size] names: h_i = hash_fn(h_{i-1}, tokens of block i as a tuple),
       with h_{-1} = None.

    Hints: 5 lines. `tuple(token_ids[i * block_size:(i + 1) * block_size])`.
    """
    ### BEGIN SOLUTION
    hashes, parent = [], None
    for i in range(len(token_ids) // block_size):
        parent = hash_fn(parent, tuple(token_ids[i * block_size:(i + 1) * block_size]))
        hashes.append(parent)
    return hashes
    ### END SOLUTION


# %%
check("3.4")
system = list(range(100, 124))  # a shared 24-token "system prompt", then two different questions
for question in ([7, 8, 9, 10, 11, 12, 13, 14], [7, 8, 9, 10, 99, 98, 97, 96]):
    print([h % 10_000 for h in block_hashes(system + question, 8)])

# %% [markdown]
# ## Exercise 3.5 · Finding a cached prefix, safely
#
# A hash is a name, not a proof. Two different prefixes can collide on the same name (with
# Python's 64-bit `hash` that is rare; with an adversary choosing prompts it need not be), and a
# collision must never hand a request someone else's K/V: that would be a silent wrong answer and
# a leak of another user's prompt. So every hit is *verified*: the cached entry must hold the same
# tokens, and its parent must be the entry matched just before (the very same object, compared
# with `is`). By induction, a verified chain of entries holds exactly this prompt's prefix.
#
# One more rule: the prompt's last token is always computed, because its logits give the first
# output token. So only full blocks that end before the last token may hit; a prompt of exactly
# `k` full blocks can reuse at most `k - 1`.

# %% exercise="3.5"
def match_prefix(token_ids: list[int], block_size: int, cache: dict[int, CachedBlock],
                 hash_fn=chain_hash) -> list[CachedBlock]:
    """The longest verified run of cached blocks at the start of a prompt.

    cache: hash -> CachedBlock. Walk the names of the full blocks of token_ids[:-1] (block_hashes);
    stop at the first name that is missing, or whose entry has other tokens, or whose parent is not
    the entry matched before it (None for the first block). -> the matched entries, in order.

    Hints: 8 lines. `block_hashes(token_ids[:-1], block_size, hash_fn)`, `cache.get(h)`, `is not`.
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


# %%
check("3.5")

# %% [markdown]
# ## Exercise 3.6 · Keeping freed blocks, evicting the least recently used
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
# An `OrderedDict` keeps insertion order and can move or pop at either end in O(1): the first
# entry is the least recently used.

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

        Hints: 1 line.
        """
        ### BEGIN SOLUTION
        self.entries[entry.block] = entry
        ### END SOLUTION

    def reuse(self, block: int) -> None:
        """A prefix hit takes `block` back into use: it is no longer evictable (and stays cached).

        Hints: 1 line.
        """
        ### BEGIN SOLUTION
        del self.entries[block]
        ### END SOLUTION

    def evict(self, cache: dict[int, CachedBlock]) -> int:
        """Take the least recently used block for new K/V: remove it from the entries and its
        name from `cache` (its contents are about to be overwritten). -> its block id.

        Hints: 3 lines. `self.entries.popitem(last=False)`.
        """
        ### BEGIN SOLUTION
        block, entry = self.entries.popitem(last=False)
        del cache[entry.hash]
        return block
        ### END SOLUTION


# %%
check("3.6")

# %% [markdown]
# ## Your parts in the real engine
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
# ## Measure it: how much memory does each layout waste?
#
# Replay a chat-like workload (prompt and output lengths log-normal, like public chat traces) as a
# server would run it: 16 requests at a time, each growing by one token per step, a new request
# starting whenever one finishes. At every step, count the token slots each layout *reserves*:
#
# * **contiguous, max length**: every request reserves the model's whole context (2048 here), what
#   early servers did;
# * **contiguous, prompt + max_tokens**: every request reserves its prompt plus the longest answer
#   it may give (512), the best a contiguous cache can do without knowing the future;
# * **paged**: your `BlockAllocator`, growing each request one block at a time.

# %%
workload = chat_workload(120, seed=0, max_output=512)
MAX_MODEL_LEN, BATCH = 2048, 16


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


trace = replay(block_size=16)
fig = go.Figure([go.Scatter(y=v, name=k, mode="lines") for k, v in trace.items()])
fig.update_layout(title="KV token slots held while serving 120 chat requests, 16 at a time",
                  xaxis_title="decode step", yaxis_title="token slots", yaxis_type="log", height=380)
fig.show()
for name in ("max length", "prompt + max_tokens", "paged"):
    print(f"{name:>20}: {1 - sum(trace['stored']) / sum(trace[name]):6.1%} of reserved slots never hold a token")

# %% [markdown]
# Contiguous allocation wastes most of what it reserves, as the PagedAttention paper measured on
# real systems (60–80%); paged allocation wastes only the tail of each request's last block. The
# block size trades that waste against bookkeeping: bigger blocks mean shorter tables and
# longer contiguous reads for the kernel, but more empty slots at the end.

# %%
block_sizes = [1, 4, 16, 64, 256]
waste = []
for bs in block_sizes:
    t = replay(bs)
    waste.append(1 - sum(t["stored"]) / sum(t["paged"]))
fig = go.Figure(go.Bar(x=[str(b) for b in block_sizes], y=[w * 100 for w in waste],
                       text=[f"{w:.1%}" for w in waste], textposition="outside"))
fig.update_layout(title="Paged: share of reserved slots that are empty, by block size",
                  xaxis_title="block size (tokens)", yaxis_title="waste (%)", height=340)
fig.show()

# %% [markdown]
# Waste matters because it decides **how many requests fit at once** in a fixed pool, and so the
# batch size and the throughput. `minillm.bench.memory.concurrency` admits requests first come,
# first served into a pool of 16,384 slots and counts how many run at once while the queue is full:

# %%
pool = 16_384
fits = {"max length": concurrency(workload, pool, 16, lambda r: MAX_MODEL_LEN),
        "prompt + max_tokens": concurrency(workload, pool, 16, lambda r: r.prompt_len + r.max_tokens),
        "paged, block 16": concurrency(workload, pool, 16)}
for name, n in fits.items():
    print(f"{name:>20}: {n:5.1f} requests at once")

# %% [markdown]
# ## Measure it: prefix-cache hits and time to first token
#
# Now the real engine. Every request below is a 384-token prompt whose first part is shared with
# the other requests (a system prompt, a few-shot preamble, a chat history) and whose rest is its
# own. Sweeping the shared share from 0% to ~96% sweeps the hit rate. The engine prefills only the
# blocks it did not find, so the time to first token (TTFT) should fall as the hit rate rises.

# %%
llm = LLM("tiny")  # the bundled model
vocab = llm.model.config.vocab_size
gen = torch.Generator().manual_seed(0)
PROMPT, REQUESTS = 384, 6
greedy = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)
llm.generate([torch.randint(1, vocab, (PROMPT,), generator=gen).tolist()], greedy)  # warm-up

rows = []
for shared in (0, 96, 192, 288, 368):
    prefix = torch.randint(1, vocab, (shared,), generator=gen).tolist()  # new tokens: a cold cache
    prompts = [prefix + torch.randint(1, vocab, (PROMPT - shared,), generator=gen).tolist() for _ in range(REQUESTS)]
    outs = [llm.generate([p], greedy)[0] for p in prompts]  # one at a time: TTFT without queueing
    warm = outs[1:]  # the first request fills the cache
    hit = sum(o.metrics["cached_prompt_tokens"] for o in warm) / (PROMPT * len(warm))
    rows.append((shared, hit, statistics.median(o.metrics["ttft"] for o in warm) * 1e3))
for shared, hit, ttft in rows:
    print(f"shared {shared:3d} tokens: hit rate {hit:5.1%}, median TTFT {ttft:6.2f} ms")
fig = go.Figure(go.Scatter(x=[r[1] * 100 for r in rows], y=[r[2] for r in rows], mode="lines+markers",
                           text=[f"{r[0]} shared tokens" for r in rows]))
fig.update_layout(title="Prefix caching on minillm: TTFT vs hit rate (384-token prompts)",
                  xaxis_title="prefix-cache hit rate (% of prompt tokens)", yaxis_title="median TTFT (ms)", height=340)
fig.show()

# %% [markdown]
# The hit rate steps in whole blocks (16 tokens here): 368 shared tokens give 23 full blocks.
# TTFT falls with the tokens left to compute, down to a floor: the step's fixed costs, and the
# last tokens' attention over the whole prompt, are paid either way. (This machine may be shared:
# if a point looks off, run the cell again; the trend is what to read.)
#
# Reuse must not change a single token of the output. Compare greedy outputs with the cache on
# and off:

# %%
off = LLM("tiny", enable_prefix_caching=False)
long = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
same = [llm.generate([p], long)[0].token_ids == off.generate([p], long)[0].token_ids for p in prompts[:3]]
print("outputs identical with and without prefix caching:", all(same))

# %% [markdown]
# ## How production engines do it
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
