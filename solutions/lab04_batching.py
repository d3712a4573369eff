# %% [markdown]
# # Lab 04 · Batching and scheduling
#
# **Time:** about 125 minutes in all, per section below. **You need:** lab 00 (the roofline), lab 02
# (prefill and decode) and lab 03 (block tables).
#
# **See it run:** the visualizer's **Scheduler timeline** page (`make app`, then "Scheduler timeline" in
# the sidebar) draws what the scheduler gives each request at every step, live. **Read more:**
# `docs/engine.md`, sections "One step, in three parts" and "Scheduling" (every scheduling knob).
#
# A decode step reads every weight of the model to produce one token per sequence. Reading them
# once for many sequences costs little more than reading them for one, so **batching** is where an
# engine's throughput comes from. *How* requests are batched decides the latency: who waits for
# whom, and for how long. Every step, an engine's **scheduler** answers one question: which
# sequences run now, and how many tokens does each compute?
#
# In this lab you write `minillm`'s answer, its **step policy**, from the simplest to what vLLM and
# SGLang do today: static batches, iteration-level (continuous) batching under a token budget,
# chunked prefill, and preemption when KV memory runs out. The three policy functions you write
# have exactly the signatures of the engine's own (`minillm/engine/policy.py`), so the engine can
# run yours in place of its own. Then you flatten a step into the tensors the model runs on, and
# measure each policy, first on a simulated clock, then on `minillm` driven by your code, and last
# on SmolLM2-135M, where you predict from lab 00's roofline the batch size at which decode turns
# compute-bound on this machine.
#
# ## Learning objectives
# By the end you can
# 1. explain why a static batch wastes its slots and how continuous batching (Orca) fixes it;
# 2. schedule one step under a token budget, running sequences first, and split a long prompt into chunks;
# 3. choose which sequence to preempt when the KV pool is full, and say why the newest;
# 4. flatten a step's sequences into one padding-free batch: input ids, positions, `cu_seqlens`, slot mapping;
# 5. read a Gantt chart of steps × requests, and measure throughput and latency percentiles per policy;
# 6. predict from the roofline where a batched decode step turns compute-bound, and measure it on a real model.
#
# ## How this lab works
# Write code only in the exercise cells (they contain `raise NotImplementedError`), keeping names
# and signatures. Run each `check(...)` cell for feedback. `make grade LAB=04` grades the notebook,
# and like `check("4.E")` at the end of the lab it also runs your step policy **inside the real
# engine** and compares the tokens it generates with those of the engine's own policy.
# `minillm/engine/policy.py` and `minillm/engine/scheduler.py` hold the engine's version: read them
# after you finish, not before.

# %% tags=["setup"]
from collections import deque
from dataclasses import dataclass

import torch
from torch import Tensor

from minillm.engine.policy import SchedulerOps
from minillm.labkit import check
from minillm.sequence import Sequence
from minillm.arith import cdiv


@dataclass(eq=False)  # eq=False: requests are compared by identity, like the engine's sequences
class Request:
    """A request as a step policy sees it: counts only, no tokens and no model. Its attributes have
    the names of the engine's `Sequence`, so a policy written for one runs on the other."""
    request_id: int
    num_prompt_tokens: int
    max_tokens: int                # output tokens it generates before it stops
    arrival: float = 0.0           # seconds, on the simulated clock
    num_computed_tokens: int = 0   # tokens whose K/V are in the cache
    num_output_tokens: int = 0     # output tokens generated so far

    def __len__(self) -> int:
        """Tokens known so far: the prompt and the output."""
        return self.num_prompt_tokens + self.num_output_tokens

    @property
    def num_tokens_to_compute(self) -> int:
        """Tokens to compute before it can sample again: the rest of its prompt, or 1 to decode."""
        return len(self) - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.num_output_tokens >= self.max_tokens


class SimScheduler:
    """The engine scheduler's operations (minillm/engine/scheduler.py) on Requests, with a simulated
    pool of `num_blocks` KV blocks of `block_size` slots: only counts, no tensors. A step policy
    reads `running` and `waiting` and acts only through admit, grow, preempt and make_room."""

    def __init__(self, num_blocks: int, block_size: int = 16) -> None:
        self.running: list[Request] = []        # in admission order: the newest is last
        self.waiting: deque[Request] = deque()  # first come, first served
        self.num_free_blocks, self.block_size = num_blocks, block_size
        self.blocks: dict[int, int] = {}        # request_id -> blocks it holds
        self.num_preemptions = 0

    def admit(self, req: Request) -> bool:
        """Move a waiting request to the end of `running`, with blocks for all its tokens.
        -> False if the pool has no room for them (nothing changes)."""
        if req not in self.waiting:
            raise RuntimeError(f"admitted request {req.request_id}, which is not waiting")
        needed = cdiv(len(req), self.block_size)
        if needed > self.num_free_blocks:
            return False
        self.waiting.remove(req)
        self.running.append(req)
        self.blocks[req.request_id] = 0
        self._take(req, needed)
        return True

    def grow(self, req: Request, num_tokens: int) -> bool:
        """Blocks for num_tokens more tokens of a running request. -> False if there is no room."""
        if req not in self.running:
            raise RuntimeError(f"grew request {req.request_id}, which is not running")
        needed = cdiv(req.num_computed_tokens + num_tokens, self.block_size) - self.blocks[req.request_id]
        if needed > self.num_free_blocks:
            return False
        self._take(req, max(needed, 0))
        return True

    def preempt(self, req: Request) -> None:
        """Free its blocks and put it back at the front of the queue; its K/V must be recomputed."""
        if req not in self.running:
            raise RuntimeError(f"preempted request {req.request_id}, which is not running")
        self.finish(req)
        req.num_computed_tokens = 0
        self.waiting.appendleft(req)
        self.num_preemptions += 1

    def make_room(self, req: Request, num_tokens: int) -> bool:
        return make_room(self, req, num_tokens)  # your Exercise 4.4

    def finish(self, req: Request) -> None:
        """It leaves `running`, and its blocks go back to the pool."""
        self.running.remove(req)
        self.num_free_blocks += self.blocks.pop(req.request_id)

    def holds(self, req: Request, num_tokens: int) -> bool:
        """Whether its blocks have slots for its first num_tokens tokens."""
        return self.blocks.get(req.request_id, 0) * self.block_size >= num_tokens

    def _take(self, req: Request, n: int) -> None:
        self.num_free_blocks -= n
        self.blocks[req.request_id] += n


def show(plan: list[tuple[Request, int]]) -> list[tuple[int, int]]:
    """A step's plan as (request id, tokens) pairs, for printing."""
    return [(req.request_id, n) for req, n in plan]


# %%
import time

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from minillm import LLM, SamplingParams
from minillm.bench.chunked import percentile
from minillm.config import Components

torch.set_num_threads(1)  # small model, small steps: one thread avoids thread-pool overhead

# %% [markdown]
# ## The concept: a step, and what it costs (~10 min)
#
# A step policy's decision is a list of `(sequence, tokens to compute)` pairs. After the step runs,
# each sequence has that many more tokens in its cache, and a sequence whose step reached the end
# of its known tokens **samples** one new token:
#
# * a sequence with its whole prompt still to compute **prefills** (many tokens, then its first
#   output token: that sets the time to first token);
# * a sequence with one token to compute **decodes** (one token in, one token out).
#
# Every token computed needs a slot in the KV cache, so the policy first makes sure each sequence
# it schedules holds blocks for its new tokens. It does so through the scheduler's operations, the
# same in `minillm` as in `SimScheduler` above:
#
# * `sched.admit(seq)`: move a waiting sequence to the end of `sched.running`, with blocks for all
#   its tokens (tokens a prefix-cache hit supplies count as computed); `False`: the pool has no
#   room, and nothing changed;
# * `sched.grow(seq, n)`: blocks for `n` more tokens of a running sequence; `False`: no room;
# * `sched.preempt(seq)`: free its blocks, and put it back at the front of `sched.waiting`, to be
#   recomputed;
# * `sched.make_room(seq, n)`: grow, preempting the newest running sequences until it fits (your
#   Exercise 4.4).
#
# `run_step` below plays one step of a plan on a `SimScheduler`; everything simulated in this lab
# runs on it. Here it plays one request by hand: admitted, then grown for each step's tokens.

# %%
def run_step(sched: SimScheduler, plan: list[tuple[Request, int]]) -> list[Request]:
    """Apply one step's work; a request that samples its last token leaves, freeing its blocks.
    -> the requests that sampled a token in this step."""
    sampled = []
    for req, n in plan:
        if not sched.holds(req, req.num_computed_tokens + n):
            raise RuntimeError(f"request {req.request_id} was given {n} tokens without KV room for them")
        req.num_computed_tokens += n
        if req.num_computed_tokens == len(req):  # reached its last known token: its logits give a new one
            req.num_output_tokens += 1
            sampled.append(req)
            if req.is_finished:
                sched.finish(req)
    return sampled


sched = SimScheduler(num_blocks=8, block_size=4)
req = Request(0, num_prompt_tokens=7, max_tokens=3)
sched.waiting.append(req)
print("admitted:", sched.admit(req), f"holding {sched.blocks[0]} blocks")
for step in range(3):
    n = req.num_tokens_to_compute
    grew = sched.grow(req, n)  # room for this step's tokens
    held = sched.blocks[0]
    run_step(sched, [(req, n)])
    print(f"step {step}: {n} token(s) to compute, room: {grew}, holding {held} blocks -> computed "
          f"{req.num_computed_tokens}, output {req.num_output_tokens}"
          + ("; finished, its blocks are back in the pool" if req.is_finished else ""))

# %% [markdown]
# ## Exercise 4.1 · A static batcher (~10 min)
#
# The simplest batcher takes up to `max_num_seqs` waiting sequences, prefills them together, then
# decodes them together until **every** one has finished; only then does it take the next batch.
# This is what `model.generate(padded_batch)` does. A sequence leaves `sched.running` as soon as it
# finishes, but its slot stays empty: nobody joins a static batch while it runs.
#
# Picture it with other numbers: `max_num_seqs = 2`, three requests wanting 2, 5 and 1 output
# tokens. Requests 0 and 1 form the first batch. After two decode steps request 0 is done, and
# for three more steps request 1 decodes alone, while request 2, which would have fitted in the
# empty slot, waits. Only when request 1 finishes does request 2 start its own batch.
#
# A running sequence may need a new block for its next token (a decode that starts a new block).
# `sched.make_room(seq, n)` gets it one, preempting the newest running sequence if the pool is
# full; it returns `False` if the sequence had to go itself. You write `make_room` in Exercise 4.4;
# here you call it. Note what that means for a loop over the running sequences: a call made for
# one of them can take *other* sequences out of `sched.running`.

# %% exercise="4.1"
def static_step(sched: SchedulerOps, max_num_seqs: int) -> list[tuple[Sequence, int]]:
    """One step of static batching. -> [(seq, tokens to compute)], in any order.

    sched: the scheduler's operations (admit, grow, preempt, make_room) and its queues, `running`
    (oldest first) and `waiting` (front first); max_num_seqs >= 1: the most sequences in a batch.

    The rules it keeps, as the engine's static policy does:
    * while any sequence runs, nobody joins, and every running sequence computes all of its
      uncomputed tokens, with KV room for them that sched.make_room gave it, oldest first;
    * a sequence preempted during the step (by make_room, for itself or for an older one) computes
      nothing this step;
    * once nothing runs, a new batch forms from the front of the queue, in queue order, up to
      max_num_seqs sequences; the first one the pool has no room for stops it (nobody behind it
      jumps ahead); each member computes all of its uncomputed tokens, as counted after its
      admission (the prefix cache may have supplied some);
    * every pair in the plan is a running sequence, listed once, with 1 or more tokens.
    It acts only through sched's operations and changes nothing else.

    About 8 lines.
    """
    ### BEGIN SOLUTION
    if sched.running:
        batch = []
        for seq in list(sched.running):
            n = seq.num_tokens_to_compute
            if seq in sched.running and sched.make_room(seq, n):
                batch.append((seq, n))
        return batch
    while sched.waiting and len(sched.running) < max_num_seqs and sched.admit(sched.waiting[0]):
        pass
    return [(seq, seq.num_tokens_to_compute) for seq in sched.running]
    ### END SOLUTION


# %% [markdown]
# Four requests wait; the pool has 5 blocks of 4 slots. The first two prompts take 2 and 3 blocks,
# so the third finds no room and the batch starts with two, although `max_num_seqs` allows three.

# %%
sched = SimScheduler(num_blocks=5, block_size=4)
sched.waiting.extend(Request(i, p, max_tokens=3) for i, p in enumerate([7, 12, 3, 9]))
print("step:", show(static_step(sched, max_num_seqs=3)))
print("running:", [r.request_id for r in sched.running], " waiting:", [r.request_id for r in sched.waiting],
      " free blocks:", sched.num_free_blocks)

# %%
check("4.1")

# %% [markdown]
# <details><summary>Hint 1: a nudge</summary>
#
# The step has two situations, and they never mix: a batch is running, or none is. Handle them
# one at a time.
# </details>
#
# <details><summary>Hint 2: the idea</summary>
#
# While you walk over the running sequences, a `make_room` call can remove sequences you have not
# reached yet. Walk over a copy taken before the loop, and before asking for room for a sequence,
# ask whether it is still running. A `False` from `make_room` means that sequence is out too.
# </details>
#
# <details><summary>Hint 3: nearly the answer</summary>
#
# Forming a batch is a loop that keeps admitting the queue's front while the batch has a seat
# left and `admit` says yes; the plan is then every running sequence with its tokens to compute,
# read after that loop.
# </details>

# %% [markdown]
# ## Continuous batching and the token budget (~10 min, with Exercise 4.2)
#
# **Iteration-level scheduling** (Orca, Yu et al. 2022) decides the batch again at *every step*: a
# finished sequence leaves at once, and a waiting one takes its place in the next step. No slot
# idles while others finish.
#
# Joining mid-flight means a step can mix a new request's prefill (hundreds of tokens) with
# everybody else's decodes (one token each). A step's time grows with the tokens it computes, so
# engines cap them: the **token budget** `max_num_batched_tokens`. And a long prefill is the one
# thing that can blow the budget, which is what **chunked prefill** (Sarathi-Serve, Agrawal et al.
# 2024) fixes: it computes a long prompt over several steps, a chunk per step, each chunk filling
# whatever budget the decodes leave.
#
# ## Exercise 4.2 · A chunked-prefill splitter
#
# A prompt of `prompt_len` tokens arrives while `num_decodes` sequences are decoding, and they keep
# decoding until the prompt is done. Each step the decodes go first (Exercise 4.3 says why), and
# the prompt gets what they leave of the budget. Work one case by hand before you write it: a
# budget of 10 tokens, 4 decodes, a 15-token prompt.
#
# | step | decodes | left for the prompt | prompt computed so far |
# | --- | --- | --- | --- |
# | 1 | 4 | 6 | 6 |
# | 2 | 4 | 6 | 12 |
# | 3 | 4 | ? | 15 |
#
# What does step 3's chunk hold, and why must it not be dropped (its tokens need their K/V too)?
# And what happens with 10 decodes and the same budget?

# %% exercise="4.2"
def prefill_chunks(prompt_len: int, budget: int, num_decodes: int) -> list[int]:
    """The chunks in which a prompt is prefilled, one chunk per step, next to decoding sequences.

    prompt_len >= 1: the prompt's tokens; budget: the most tokens a step computes (inclusive);
    num_decodes >= 0: sequences decoding in every one of these steps, each computing one token.
    -> list[int], the tokens of the prompt computed in each step, in step order: each step gives
       the prompt as much of the budget as the decodes leave, every chunk is at least 1 token, and
       together they are the whole prompt.
    Raises ValueError, saying why, when the decodes leave the prompt no token of the budget (no
    step could make progress).

    About 5 lines.
    """
    ### BEGIN SOLUTION
    size = budget - num_decodes
    if size < 1:
        raise ValueError(f"a budget of {budget} tokens leaves no room for a prefill next to {num_decodes} decodes: "
                         f"it must be at least num_decodes + 1 = {num_decodes + 1}")
    full, last = divmod(prompt_len, size)
    return [size] * full + ([last] if last else [])
    ### END SOLUTION


# %%
check("4.2")
print(prefill_chunks(15, budget=10, num_decodes=4))

# %% [markdown]
# <details><summary>Hint 1: a nudge</summary>
#
# In the table above, which chunks have the same size, and which one may differ?
# </details>
#
# <details><summary>Hint 2: the idea</summary>
#
# The decodes take the same share of every step, so every chunk but the last has one size: what
# they leave. The last chunk is what remains of the prompt after the full ones, if anything does.
# </details>
#
# <details><summary>Hint 3: the formula</summary>
#
# The number of full chunks and the last chunk are the quotient and the remainder of dividing the
# prompt by the chunk size; check the chunk size is positive before you divide.
# </details>

# %% [markdown]
# ## Exercise 4.3 · One continuous-scheduling step (~25 min)
#
# Now the whole decision, as `minillm` makes it every step. It is easiest to build from the
# questions a scheduler has to answer, each with its reason.
#
# **Who goes first?** Running sequences, oldest first, then waiting ones, front of the queue
# first. A running sequence already holds KV memory and someone is waiting for its next token; a
# new prompt can wait a step. And first come, first served, within each group.
#
# **What does the budget bound?** The tokens of the whole step, inclusive: a step may compute
# exactly `budget` tokens. With chunking, a sequence may take part of what it needs: the budget
# left, if that is less. Without chunking a sequence takes all of its uncomputed tokens or none.
# That leaves one hole: a prompt longer than the budget could never run. So the first sequence of
# a step that is still empty runs whole, over the budget if it must.
#
# **What happens to a running sequence that gets nothing?** It keeps its blocks and its seat in
# `max_num_seqs`: skipping it for a step is not preempting it.
#
# **Memory.** A running sequence computes only once it holds KV room for its tokens, which
# `sched.make_room` gets it (Exercise 4.4), perhaps by preempting newer sequences, perhaps by
# preempting the sequence itself. Preempted sequences are waiting again: they compute nothing
# this step.
#
# **When does admission give up?** Waiting sequences join in queue order, so the first one that
# cannot join stops admission for this step, and nobody behind it jumps ahead. It cannot join when
# the running sequences already fill `max_num_seqs`, when no budget is left, when (unchunked) it
# does not fit the budget left in a step that already holds someone, or when the pool has no room
# for it (`sched.admit` says `False`). Once admitted, a sequence's tokens to compute are counted
# anew: a prefix-cache hit has made some of them computed.
#
# A worked example on other numbers: a budget of 10, `max_num_seqs = 3`, chunked, a roomy pool.
# Running: A decoding, B a 30-token prompt with 22 computed. Waiting: C (6 tokens), D (2 tokens).
# A takes 1 token, B wants 8 and 9 are left: it takes 8. One token is left, so C is admitted with
# a chunk of 1, and admission stops there: 3 sequences run now. Unchunked, B's 8 tokens still fit
# (9 left), but C's 6 do not fit the 1 left, so C waits, and D behind it waits too, though its 2
# tokens would not have fitted either. Try it again with a budget of 5, both ways.

# %% exercise="4.3"
def continuous_step(sched: SchedulerOps, budget: int, max_num_seqs: int,
                    chunked: bool) -> list[tuple[Sequence, int]]:
    """One step of continuous batching under a token budget. -> [(seq, tokens to compute)], in any order.

    sched: the scheduler's operations and queues, as in 4.1; budget >= 1: the most tokens the
    step computes, inclusive; max_num_seqs >= 1: the most sequences running after the step, idle
    ones included; chunked: whether a sequence may compute only part of its uncomputed tokens.

    The rules it keeps, exactly as the engine's continuous policy does:
    * running sequences are served before waiting ones; each group oldest / front first;
    * the step's tokens stay within the budget: chunked, a sequence gets what it needs or the
      budget left, whichever is less; unchunked, all of its uncomputed tokens or nothing, except
      that the first sequence of a still-empty step runs whole even over the budget;
    * a running sequence that gets no tokens keeps its blocks and its seat, and the running
      sequences after it still get their turn;
    * KV room (sched.make_room) is asked for only for a running sequence that computes this
      step, and only for the tokens it computes; a sequence preempted during the step (itself,
      or a newer one for an older one) computes nothing this step;
    * admission (sched.admit) goes in queue order and stops at the first waiting sequence that
      cannot join: no seat left under max_num_seqs, no budget left, unchunked not fitting the
      budget left in a non-empty step (judged on its tokens to compute while it waits, before
      admit has looked at the prefix cache), or no KV room; a sequence is admitted only if it computes
      this step, its tokens to compute counted after admission (prefix-cache hits count as
      computed);
    * every pair in the plan is a running sequence, listed once, with 1 or more tokens.
    It acts only through sched's operations and changes nothing else.

    About 20 lines.
    """
    ### BEGIN SOLUTION
    batch, left = [], budget
    for seq in list(sched.running):
        if seq not in sched.running:
            continue  # preempted while making room for an older sequence
        n = min(seq.num_tokens_to_compute, left) if chunked else seq.num_tokens_to_compute
        if n == 0 or (n > left and batch):
            continue
        if not sched.make_room(seq, n):
            continue
        batch.append((seq, n))
        left -= n
    while sched.waiting and len(sched.running) < max_num_seqs and left > 0:
        seq = sched.waiting[0]
        if not chunked and seq.num_tokens_to_compute > left and batch:
            break
        if not sched.admit(seq):
            break
        n = min(seq.num_tokens_to_compute, left) if chunked else seq.num_tokens_to_compute
        batch.append((seq, n))
        left -= n
    return batch
    ### END SOLUTION


# %% [markdown]
# Three prompts of 5, 30 and 4 tokens wait, with a budget of 16 and a roomy pool. Before you run
# the cell, write down the step you expect, chunked and unchunked, from the rules above.

# %%
for chunked in (True, False):
    sched = SimScheduler(num_blocks=100, block_size=4)
    sched.waiting.extend(Request(i, p, max_tokens=3) for i, p in enumerate([5, 30, 4]))
    print(f"chunked={chunked}: step", show(continuous_step(sched, budget=16, max_num_seqs=4, chunked=chunked)),
          " waiting:", [r.request_id for r in sched.waiting])

# %%
check("4.3")

# %% [markdown]
# <details><summary>Hint 1: a nudge</summary>
#
# Keep one number as you go: the budget not yet given out this step. Every rule above reads it.
# </details>
#
# <details><summary>Hint 2: the idea</summary>
#
# Two loops, one per group. The first walks over the running sequences as they were when the step
# began, and passes over any that is no longer running when its turn comes (an earlier
# `make_room` took it out). The second keeps looking at the front of the queue, and ends at the
# first reason it cannot join. "The step is still empty" is a fact about the plan you are
# building, not about `sched.running`.
# </details>
#
# <details><summary>Hint 3: nearly the answer</summary>
#
# For each sequence, in either loop: work out how many tokens it would get (its tokens to compute,
# cut to the budget left when chunking); decide if it sits out (nothing to give it, or unchunked
# and too big for a step that holds someone); get it room (`make_room` when running, `admit` when
# waiting, re-reading its tokens after `admit`); add it to the plan and take its tokens off the
# budget left.
# </details>

# %% [markdown]
# ## Exercise 4.4 · Preemption: who gives up their memory? (~10 min)
#
# Continuous batching admits sequences while their *prompts* fit, betting that blocks will free up
# as others finish. Sometimes the bet fails: a running sequence needs a new block for its next
# token and the pool is empty. Something must give. `minillm` and vLLM **preempt**: free a running
# sequence's blocks and put it back at the front of the queue, to be *recomputed* later (its
# tokens are kept, its K/V are not). (vLLM also offers *swapping* K/V to CPU memory instead.)
#
# Which one? The **newest** running sequence. It has done the least work, so recomputing it costs
# least, and taking it keeps first come, first served: the oldest requests finish first. Three
# more questions settle the policy, and your `make_room` must answer them as the engine does:
#
# * *How many victims?* No more than needed: as soon as the needy sequence's tokens fit, stop.
#   If they fit from the start, nobody goes.
# * *What if the needy sequence is the newest left?* Then it is the victim, and nothing older is
#   taken for it: an older sequence never gives way to a newer one.
# * *What does the caller learn?* Whether the needy sequence now holds room (it computes this
#   step) or was itself preempted (it does not).
#
# An example on other numbers: four running sequences holding 3, 1, 2 and 2 blocks (oldest
# first), no block free, and the oldest needs 3 more blocks. The newest goes (2 free), then the
# one before it (4 free): enough, so the second-oldest keeps its block. Had the oldest needed 6
# blocks, the second-oldest would go too (5 free), and then the oldest itself would be the newest
# left.

# %% exercise="4.4"
def make_room(sched: SchedulerOps, seq: Sequence, num_tokens: int) -> bool:
    """KV room for num_tokens more tokens of seq, preempting running sequences if the pool is full.

    seq: a running sequence; num_tokens >= 1. -> True: seq now holds KV room for those tokens;
    False: seq itself was preempted (it is waiting again, at the front of the queue).

    The rules it keeps, exactly as the engine's make_room does:
    * nobody is preempted while sched.grow can give seq the room;
    * victims are the newest running sequences, newest first, and no more of them than it takes;
    * seq goes only when it is the newest left, and then nothing older than it goes;
    * sequences leave only through sched.preempt; it changes nothing else.

    About 6 lines.
    """
    ### BEGIN SOLUTION
    while not sched.grow(seq, num_tokens):
        victim = sched.running[-1]
        sched.preempt(victim)
        if victim is seq:
            return False
    return True
    ### END SOLUTION


# %% [markdown]
# A pool of 5 blocks of 4 slots, full after three prompts of 8, 7 and 4 tokens. After their
# prefill each has sampled a token, and request 0 (now 9 tokens) needs a third block for it. The
# newest, request 2, gives its block up and goes back to the front of the queue.

# %%
sched = SimScheduler(num_blocks=5, block_size=4)
sched.waiting.extend(Request(i, p, max_tokens=4) for i, p in enumerate([8, 7, 4]))
run_step(sched, continuous_step(sched, budget=64, max_num_seqs=4, chunked=True))
print("step:", show(continuous_step(sched, budget=64, max_num_seqs=4, chunked=True)),
      " preemptions:", sched.num_preemptions, " waiting:", [r.request_id for r in sched.waiting],
      " free blocks:", sched.num_free_blocks)

# %%
check("4.4")

# %% [markdown]
# <details><summary>Hint 1: a nudge</summary>
#
# `sched.grow` says `False` and changes nothing when there is no room, so you may ask it again
# after every preemption.
# </details>
#
# <details><summary>Hint 2: the idea</summary>
#
# Repeat "ask for the room; if refused, preempt the newest running sequence" until it is given,
# and notice when the one you just preempted is `seq` itself: there is nobody left to ask for.
# </details>
#
# <details><summary>Hint 3: nearly the answer</summary>
#
# A loop on `grow`'s answer; its body takes the last running sequence, preempts it, and leaves the
# function with `False` if that was `seq` (compare identities, not equality). After the loop, `True`.
# </details>

# %% [markdown]
# ## Exercise 4.5 · Flattening a step into one batch (~10 min)
#
# The model does not see requests: it sees one batch of tokens. Padding every sequence to the
# longest would waste compute on pad tokens, so engines concatenate the step's tokens back to back
# (a *varlen* batch) and describe its structure with side tensors:
#
# * `input_ids [T]`: the tokens to compute, sequence after sequence (`T` = the step's tokens);
# * `positions [T]`: each token's **absolute** position in its own sequence; a prefill chunk or a
#   decode starts at the sequence's `computed`, not at 0 (RoPE needs the true position);
# * `cu_seqlens [B + 1]`: cumulative token counts `[0, n_0, n_0 + n_1, ...]`: sequence `i`'s rows
#   are `cu_seqlens[i] : cu_seqlens[i + 1]` (the format of FlashAttention's varlen kernels);
# * `slot_mapping [T]`: where each token's K/V go in the paged pool, as lab 03 laid it out: the
#   pool's slots numbered block after block, the position's block found through the sequence's
#   block table.
#
# ```
#  seq 0: prefill chunk, computed 4, 3 tokens   seq 1: decode, computed 9    seq 2: decode, computed 2
#  input_ids   t4  t5  t6 | u9 | v2               cu_seqlens [0, 3, 4, 5]
#  positions    4   5   6 |  9 |  2
# ```
#
# For the slots, one sequence on other numbers: blocks of 8 slots, block table `[3, 0]`. Its
# position 2 sits in its first block, the pool's block 3, whose slots are 24 to 31: slot 26. Its
# position 9 sits in its second block, the pool's block 0: slot 1. Which slot does its position
# 15 get?

# %% exercise="4.5"
def flatten_batch(token_ids: list[list[int]], computed: list[int], num_tokens: list[int],
                  block_tables: list[list[int]], block_size: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Flatten one step's B sequences into one padding-free batch of T tokens, T the step's tokens.

    token_ids[i]: every token sequence i knows; computed[i]: how many of its first tokens already
    have K/V; num_tokens[i] >= 1: how many tokens it computes in this step, the ones right after
    those; block_tables[i]: its blocks in the paged pool, in order, each block_size slots.
    -> (input_ids [T], positions [T], cu_seqlens [B + 1], slot_mapping [T]), all int64 tensors:
       the step's tokens sequence after sequence; each token's absolute position in its own
       sequence; the row offsets of the sequences, starting at 0 and ending at T; each token's slot
       in the pool, where its K/V go. It changes none of its arguments.

    About 10 lines.
    """
    ### BEGIN SOLUTION
    ids, positions, slots = [], [], []
    for seq, start, n, table in zip(token_ids, computed, num_tokens, block_tables):
        for t in range(start, start + n):
            ids.append(seq[t])
            positions.append(t)
            slots.append(table[t // block_size] * block_size + t % block_size)
    cu_seqlens = torch.cumsum(torch.tensor([0] + list(num_tokens)), 0)
    as_tensor = lambda xs: torch.tensor(xs, dtype=torch.long)  # noqa: E731
    return as_tensor(ids), as_tensor(positions), cu_seqlens.long(), as_tensor(slots)
    ### END SOLUTION


# %%
check("4.5")

# %% [markdown]
# <details><summary>Hint 1: a nudge</summary>
#
# Check your answer to the diagram above first: which tokens of seq 0 go in, and at which positions?
# </details>
#
# <details><summary>Hint 2: the idea</summary>
#
# One loop over the sequences, and inside it one over the positions that sequence computes this
# step: each position gives one row of three of the outputs. `cu_seqlens` is a running total of
# the tokens per sequence, with a 0 in front.
# </details>
#
# <details><summary>Hint 3: the formula</summary>
#
# A position's block in its own table is the quotient of the position by the block size, its
# offset in that block the remainder; its slot is that pool block's first slot plus the offset.
# </details>

# %% [markdown]
# ## Measure it on a simulated clock (~10 min)
#
# A cost model first, so that the policies can be compared without noise: a step costs a fixed
# time to read the weights, plus a time per token computed,
#
# `step time = 8 ms + 0.08 ms × tokens`,
#
# an assumed model, not a measurement: roughly a 7B model in 16-bit weights on one A100 (lab 00's
# profile, from NVIDIA's datasheet: 14 GB read at about 2 TB/s is 7 ms; 14 GFLOPs per token at
# about 175 TFLOP/s, a little over half the tensor cores' peak, is 0.08 ms). Decode steps are
# memory-bound (the fixed part), big prefills compute-bound (the per-token part). Twelve requests
# arrive over the first 0.15 s, with prompts and answers of mixed lengths. Each policy plays the
# same workload with your functions, on a `SimScheduler` with room for every request (preemption
# comes later, on the real engine):
#
# * **sequential**: one request at a time (your `continuous_step` with `max_num_seqs = 1`,
#   unchunked: what `minillm`'s `scheduler="sequential"` runs);
# * **static**: batches of up to 6;
# * **continuous**: up to 6 at once, a budget of 512 tokens, no chunking;
# * **continuous + chunked**: the same with a budget of 64 tokens, prompts in chunks.

# %%
def step_seconds(num_tokens: int) -> float:
    return 0.008 + 0.00008 * num_tokens


def make_workload(seed: int = 0) -> list[Request]:
    gen = torch.Generator().manual_seed(seed)
    prompts = torch.randint(16, 320, (12,), generator=gen).tolist()
    outputs = torch.randint(4, 40, (12,), generator=gen).tolist()
    arrivals = sorted(torch.rand(12, generator=gen).mul(0.15).tolist())
    return [Request(i, p, o, a) for i, (p, o, a) in enumerate(zip(prompts, outputs, arrivals))]


POLICIES = {
    "sequential": lambda sched: continuous_step(sched, budget=512, max_num_seqs=1, chunked=False),
    "static": lambda sched: static_step(sched, max_num_seqs=6),
    "continuous": lambda sched: continuous_step(sched, budget=512, max_num_seqs=6, chunked=False),
    "continuous + chunked": lambda sched: continuous_step(sched, budget=64, max_num_seqs=6, chunked=True),
}

# %% [markdown]
# The simulator: requests join the queue when the clock passes their arrival; each step asks the
# policy for a plan, charges its cost, and records who computed what and when each token came out.

# %%
def simulate(policy, num_blocks: int = 200) -> dict:
    """Play the workload on the simulated clock; -> steps [(start, seconds, [(id, n, phase)])],
    each request's arrival and token times, and the preemptions."""
    pending, sched = deque(make_workload()), SimScheduler(num_blocks, block_size=16)
    clock, steps, times = 0.0, [], {}
    while pending or sched.waiting or sched.running:
        while pending and pending[0].arrival <= clock:
            sched.waiting.append(pending.popleft())
        plan = policy(sched)
        if not plan:
            if not pending:
                raise RuntimeError("the policy scheduled nothing, and no request will arrive: it would wait forever")
            clock = pending[0].arrival  # nothing to do until the next arrival
            continue
        work = [(r.request_id, n, "decode" if n == 1 and r.num_computed_tokens >= r.num_prompt_tokens else "prefill")
                for r, n in plan]
        seconds = step_seconds(sum(n for _, n in plan))
        clock += seconds
        for r in run_step(sched, plan):
            times.setdefault(r.request_id, []).append(clock)
        steps.append((clock - seconds, seconds, work))
    arrivals = {r.request_id: r.arrival for r in make_workload()}
    return {"steps": steps, "arrivals": arrivals, "times": times, "preemptions": sched.num_preemptions}

# %% [markdown]
# What to report (the definitions of lab 02): output tokens per second over the whole run; TTFT and
# end-to-end latency per request; inter-token latency (ITL), every gap between two tokens of one
# request. Percentiles, because users feel the tail: p90 or p99 is the experience of the unlucky.

# %%
def summary(arrivals: dict, times: dict, elapsed: float) -> dict:
    ttft = [times[i][0] - arrivals[i] for i in times]
    itl = [b - a for t in times.values() for a, b in zip(t, t[1:])]
    e2e = [times[i][-1] - arrivals[i] for i in times]
    tokens = sum(len(t) for t in times.values())
    return {"output tok/s": tokens / elapsed, "TTFT p50": percentile(ttft, 50), "TTFT p90": percentile(ttft, 90),
            "ITL p50": percentile(itl, 50), "ITL p99": percentile(itl, 99), "E2E p90": percentile(e2e, 90)}


def print_summaries(results: dict) -> None:
    print(f"{'policy':>22} {'tok/s':>7} {'TTFT p50':>9} {'TTFT p90':>9} {'ITL p50':>8} {'ITL p99':>8} {'E2E p90':>8}")
    for name, s in results.items():
        columns = (("TTFT p50", 9), ("TTFT p90", 9), ("ITL p50", 8), ("ITL p99", 8), ("E2E p90", 8))
        times = " ".join(f"{s[k] * 1e3:{w}.0f}" for k, w in columns)
        print(f"{name:>22} {s['output tok/s']:7.0f} {times}   (ms)")


def gantt(runs: dict, title: str) -> go.Figure:
    """One row of subplots per policy: a bar per (request, step), prefill chunks vs decodes."""
    fig = make_subplots(rows=len(runs), cols=1, shared_xaxes=True, subplot_titles=list(runs), vertical_spacing=0.04)
    for row, steps in enumerate(runs.values(), 1):
        for phase, color in (("prefill", "#e4572e"), ("decode", "#3d6fb6")):
            bars = [(f"req {rid}", seconds * 1e3, start * 1e3, n) for start, seconds, work in steps
                    for rid, n, p in work if p == phase]
            if bars:
                y, x, base, n = zip(*bars)
                fig.add_trace(go.Bar(y=y, x=x, base=base, orientation="h", marker_color=color, name=phase,
                                     legendgroup=phase, showlegend=row == 1, customdata=n,
                                     hovertemplate="%{y}: %{customdata} tokens<extra></extra>"), row=row, col=1)
    names = sorted({rid for steps in runs.values() for _, _, work in steps for rid, _, _ in work})
    fig.update_yaxes(categoryorder="array", categoryarray=[f"req {rid}" for rid in reversed(names)])
    fig.update_layout(title=title, barmode="overlay", height=230 * len(runs), bargap=0.15)
    fig.update_xaxes(title_text="time (ms)", row=len(runs), col=1)
    return fig

# %%
sims = {name: simulate(policy) for name, policy in POLICIES.items()}
gantt({name: s["steps"] for name, s in sims.items()}, "Simulated clock: who computes what, step by step").show()
sim_summary = {name: summary(s["arrivals"], s["times"], s["steps"][-1][0] + s["steps"][-1][1])
               for name, s in sims.items()}
print_summaries(sim_summary)


def ratios(table: dict, where: str) -> None:
    """The comparisons the text asks about, from this table: printed, never assumed."""
    s, c, k = table["static"], table["continuous"], table["continuous + chunked"]
    print(f"{where}: continuous gives {c['output tok/s'] / s['output tok/s']:.2f}x static's tokens/s and "
          f"{c['output tok/s'] / table['sequential']['output tok/s']:.2f}x sequential's; chunked prefill gives "
          f"{k['output tok/s'] / c['output tok/s']:.2f}x unchunked continuous's tokens/s, its ITL p99 "
          f"{k['ITL p99'] * 1e3:.0f} ms against {c['ITL p99'] * 1e3:.0f} ms and its TTFT p50 "
          f"{k['TTFT p50'] * 1e3:.0f} ms against {c['TTFT p50'] * 1e3:.0f} ms")


ratios(sim_summary, "on the simulated clock")

# %% [markdown]
# Read the chart row by row, and check each point against the table and the line printed above:
#
# * **sequential** is one long line of single requests: every step reads all the weights for one
#   token. Look at its throughput, and at how long the later arrivals wait for their first token.
# * **static** batches at first, but look at each batch's tail: one long answer decodes alone while
#   the batch's other slots stay empty, and newcomers wait for the whole batch.
# * **continuous** fills a slot as soon as it frees. Look at the red bars: a step with a big
#   prefill takes several times longer than a decode step, and every request decoding in it waits
#   too. The ITL p99 column is that wait.
# * **continuous + chunked** cuts those prefills into chunks beside the decodes. Which latency did
#   chunking buy, and which one paid for it? It also takes more steps, each paying the fixed cost:
#   see what that did to the throughput here. The budget is the knob between the two.

# %% [markdown]
# ## Your step policy inside minillm (~5 min)
#
# The engine takes its step policy from `EngineConfig.components`: hand it your three functions
# and every `LLM` below schedules with your code, on real sequences with a real paged KV cache
# (prefix-cache hits included). Before every step runs, the engine's scheduler checks the plan your
# policy made (each sequence running, with KV room for its tokens, within the budget) and stops
# with an error naming your policy if it cannot run.
#
# `check("4.E")` (also part of `make grade LAB=04`) runs a workload built to exercise everything at
# once, chunked prefill, prefix-cache hits, parallel samples and preemption, through the engine
# with your policy and through the engine with its own, under both continuous and static batching:
# the generated tokens must be the same, and every KV block must be back in the pool at the end.

# %%
YOURS = Components(static_step=static_step, continuous_step=continuous_step, make_room=make_room,
                   source="this notebook")
check("4.E")

# %% [markdown]
# ## Measure it on the real engine, on SmolLM2 (~10 min)
#
# Now the simulation's comparison on `minillm` running SmolLM2-135M-Instruct with your policy,
# read from the engine's telemetry: `engine.subscribe(observer)` registers a function that the
# engine calls after every step with a `StepEvent` (when the step started, how long it took, and
# what it scheduled: a `ScheduledWork` per sequence, with its tokens and whether they were prefill
# or decode). The workload has the simulated one's mix of short and long answers, with prompts a
# quarter as long (a CPU prefills far slower than the GPU we simulated), and all requests arrive
# at once: an offline batch. Every number is measured on this machine, so expect noise (it may be
# shared) and read the ratios. Under the test suite (`quick_run()`) the run is smaller: fewer
# requests, shorter answers, one repetition. A learner's run takes a minute or two.

# %%
from minillm.labkit import REAL_MODEL, quick_run, real_model_installed

MODEL = REAL_MODEL if real_model_installed() else "tiny"  # tiny only when SmolLM2 is not installed
QUICK = quick_run()  # True under the test suite only: the same experiment, smaller


def real_workload() -> list[Request]:
    """The simulated workload's requests, prompts a quarter as long (fewer, with shorter answers, when quick)."""
    reqs = make_workload()[:6 if QUICK else 12]
    return [Request(r.request_id, max(4, r.num_prompt_tokens // 4), max(2, r.max_tokens // (2 if QUICK else 1)))
            for r in reqs]


llm_policies = {
    "sequential": dict(scheduler="sequential"),
    "static": dict(scheduler="static", max_num_seqs=6),
    "continuous": dict(scheduler="continuous", max_num_seqs=6, max_num_batched_tokens=512,
                       enable_chunked_prefill=False),
    "continuous + chunked": dict(scheduler="continuous", max_num_seqs=6, max_num_batched_tokens=64),
}
workload = real_workload()
params = [SamplingParams(max_tokens=r.max_tokens, temperature=0, ignore_eos=True) for r in workload]


def measure(config: dict, repeats: int = 1 if QUICK else 2) -> dict:
    """The fastest of `repeats` runs of the engine with your step policy (other processes on this
    machine only ever slow a run down)."""
    llm = LLM(MODEL, components=YOURS, **config)
    gen = torch.Generator().manual_seed(1)  # the same random prompts for every policy
    prompts = [torch.randint(1, llm.model.config.vocab_size, (r.num_prompt_tokens,), generator=gen).tolist()
               for r in workload]
    llm.generate([prompts[0][:4]], [SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)],
                 use_tqdm=False)  # warm-up
    events, best = [], None
    llm.engine.subscribe(events.append)
    for _ in range(repeats):
        first, start = len(events), time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)  # all arrive at once: an offline batch
        elapsed = time.perf_counter() - start
        if best is None or elapsed < best[0]:
            best = (elapsed, start, events[first:], outs)
    elapsed, start, events, outs = best
    ids = [o.request_id for o in outs]
    steps = [(e.start - start, e.duration, [(ids.index(w.request_id), w.num_tokens, w.phase) for w in e.scheduled])
             for e in events]
    arrivals = {i: 0.0 for i in range(len(outs))}
    times = {}
    for i, o in enumerate(outs):  # token times from TTFT and the inter-token gaps
        t = [o.metrics["ttft"]]
        for gap in o.metrics["itl"]:
            t.append(t[-1] + gap)
        times[i] = t
    return {"steps": steps, "summary": summary(arrivals, times, elapsed), "outputs": [o.token_ids for o in outs],
            "preemptions": sum(len(e.preempted) for e in events)}


real = {name: measure(config) for name, config in llm_policies.items()}
gantt({name: r["steps"] for name, r in real.items()}, f"{MODEL} with your policy: steps × requests").show()
print_summaries({name: r["summary"] for name, r in real.items()})
ratios({name: r["summary"] for name, r in real.items()}, f"on {MODEL}, this machine")
decode_steps = [d for _, d, work in real["sequential"]["steps"] if all(p == "decode" for _, _, p in work)]
print(f"a decode step of one request took {1e3 * sorted(decode_steps)[len(decode_steps) // 2]:.0f} ms here (median)")
print("greedy outputs identical across policies:",
      all(r["outputs"] == real["sequential"]["outputs"] for r in real.values()))

# %% [markdown]
# Set the two lines printed, the simulated clock's and this machine's, side by side. Which
# orderings carried over, and which did not? The fit two cells below says why some did not. And
# remember that here every request arrives at once: count in the Gantt chart the steps that mix a
# prefill with decodes, under each policy, since those are the steps chunking is there to shorten.
#
# **Preemption, for real.** Shrink the KV pool to room for the longest request and two blocks
# more, and run the chunked policy again. Your `continuous_step` admits requests while their
# prompts fit; when a running request then needs a block and none is free, your `make_room`
# preempts the newest, which is recomputed later: look for a request whose prefill bars come back
# after its decodes started. Nothing is lost, and greedy outputs do not change.

# %%
tight_blocks = max(cdiv(r.num_prompt_tokens + r.max_tokens, 16) for r in workload) + 2
tight = measure({**llm_policies["continuous + chunked"], "num_kv_blocks": tight_blocks}, repeats=1)
print(f"a pool of {tight_blocks} blocks of 16 slots: {tight['preemptions']} preemptions; outputs identical to the "
      f"roomy pool: {tight['outputs'] == real['continuous + chunked']['outputs']}")
gantt({f"continuous + chunked, a {tight_blocks}-block KV pool": tight["steps"]},
      "Preempted requests prefill again").show()
print_summaries({"roomy pool": real["continuous + chunked"]["summary"], f"{tight_blocks}-block pool": tight["summary"]})

# %% [markdown]
# **This machine's cost model.** Fit `step time = fixed + per_token × tokens` to every measured step
# above (least squares), and compare it with the one the simulation assumed.

# %%
tokens = torch.tensor([sum(n for _, n, _ in work) for r in real.values() for _, _, work in r["steps"]],
                      dtype=torch.float64)
seconds = torch.tensor([d for r in real.values() for _, d, _ in r["steps"]], dtype=torch.float64)
design = torch.stack([torch.ones_like(tokens), tokens], 1)  # [steps, 2]
fixed, per_token = torch.linalg.lstsq(design, seconds[:, None]).solution.flatten().tolist()
print(f"this machine, {MODEL}: step ≈ {fixed * 1e3:.2f} ms + {per_token * 1e3:.3f} ms × tokens;  "
      f"simulated: 8 ms + 0.080 ms × tokens")
print(f"the per-token part equals the fixed part at {fixed / per_token:.0f} tokens here, at 100 in the simulation")
fig = go.Figure([go.Scatter(x=tokens, y=seconds * 1e3, mode="markers", name="measured steps", opacity=0.5),
                 go.Scatter(x=[0, float(tokens.max())], name="fit",
                            y=[fixed * 1e3, (fixed + per_token * float(tokens.max())) * 1e3])])
fig.update_layout(title=f"Step time vs tokens computed, {MODEL} on this machine", xaxis_title="tokens in the step",
                  yaxis_title="ms", height=320)
fig.show()

# %% [markdown]
# Read the fit against the simulation's. The fewer tokens it takes the per-token part to catch up
# with the fixed part, the less a batch of decodes is nearly free, and the more every extra step
# (chunking makes more of them, each paying the fixed part) weighs against the latency it saves.
# Did chunking cost throughput on this machine, or gain some? The printed line above says; the
# answer depends on where this machine's crossing falls, which the last section measures. Put the
# fitted numbers into `step_seconds` and run the simulation again: it should now come much closer
# to this machine. `python -m minillm.bench throughput` and `python -m minillm.bench chunked` run
# larger, repeated versions of these measurements.
#
# ## Predict, then measure: where decode turns compute-bound (~20 min)
#
# A decode step of SmolLM2 must stream all of its float32 weights from memory, whatever the batch,
# while each sequence in the batch adds only its own arithmetic: about 2 FLOPs per parameter, and a
# little attention, small at these short contexts. Lab 00's roofline gives the step two costs,
# the **bytes time** (reading the weights once, at this machine's bandwidth) and the **FLOPs time**
# (every sequence's arithmetic, at this machine's FLOP/s); the step takes about the larger of the two:
#
# * while the bytes time is larger, the step is **memory-bound**: a sequence added to the batch is
#   nearly free, and tokens/s grows with the batch;
# * past the batch where the FLOPs time reaches the bytes time, it is **compute-bound**: each
#   sequence added costs its full arithmetic, and tokens/s stops growing.
#
# A worked example on other numbers: a 1B-parameter model in bfloat16 (2 GB) on a machine with
# 100 GB/s and 2 TFLOP/s. Reading the weights takes 20 ms; one token's arithmetic, 2 × 10⁹ FLOPs,
# takes 1 ms; so the two times meet at a batch of 20. Now measure this machine's two ceilings, with
# the same functions lab 00 uses (`minillm/perf/machine.py`; the best of three, on one thread, as
# the engine runs in this lab), and count SmolLM2's parameters.

# %%
from minillm.perf import measure_bandwidth, measure_flops

cpu_bandwidth = max(measure_bandwidth(torch.device("cpu")) for _ in range(3))  # bytes/s, a large copy
cpu_flops = max(measure_flops(torch.device("cpu"), torch.float32) for _ in range(3))  # FLOP/s, a 1024² matmul
sweep_llm = LLM(MODEL, components=YOURS, scheduler="continuous", max_num_seqs=128, max_num_batched_tokens=1024)
params_count = sum(p.numel() for p in sweep_llm.model.parameters())  # the tied embedding counted once
weight_bytes = params_count * 4  # float32
print(f"this machine: {cpu_bandwidth / 1e9:.1f} GB/s, {cpu_flops / 1e9:.1f} GFLOP/s (one thread); "
      f"{MODEL}: {params_count / 1e6:.0f}M parameters, {weight_bytes / 1e6:.0f} MB of float32 weights")

# %% [markdown]
# Your turn, before anything is timed: at what batch size does a decode step of SmolLM2 turn
# compute-bound on this machine? Work it out from the three numbers just printed, as in the
# example above.

# %%
MY_PREDICTION = None  # batch size: work it out from the bandwidth, FLOP/s and weights printed above

# %% [markdown]
# The cell below runs batches of requests of 8 prompt tokens and 8 output tokens each through the
# engine with your step policy, all arriving at once, and keeps the fastest of the steps in which
# every request of the batch decodes (other processes only ever slow a step down): 1 to 128
# requests, 4 batch sizes with 4 output tokens when quick. About a minute on a 2-core CPU.
#
# What counts as the **measured** crossover? The cell fits the measured decode-step times to
# `fixed + per_request × batch` (least squares, like the cost model above): the fixed part is what
# a step costs whatever the batch, the measured counterpart of the bytes time, and the per-request
# part what each request adds, the measured counterpart of one token's FLOPs time. The measured
# crossover is the batch where the two parts are equal, as the roofline's is where its two times are.

# %%
from minillm.labkit import compare

step_events = []
sweep_llm.engine.subscribe(step_events.append)
sweep_llm.generate([[1, 2, 3, 4]], SamplingParams(max_tokens=3, temperature=0, ignore_eos=True),
                   use_tqdm=False)  # warm-up
gen = torch.Generator().manual_seed(2)
batch_sizes = [1, 4, 16, 32] if QUICK else [1, 2, 4, 8, 16, 32, 64, 128]
decode_ms = []
for b in batch_sizes:
    prompts = [torch.randint(1, sweep_llm.model.config.vocab_size, (8,), generator=gen).tolist() for _ in range(b)]
    first = len(step_events)
    sweep_llm.generate(prompts, SamplingParams(max_tokens=4 if QUICK else 8, temperature=0, ignore_eos=True),
                       use_tqdm=False)
    decode_ms.append(1e3 * min(e.duration for e in step_events[first:]
                               if len(e.scheduled) == b and all(w.phase == "decode" for w in e.scheduled)))
del sweep_llm
throughput = [b / ms * 1e3 for b, ms in zip(batch_sizes, decode_ms)]
bytes_ms = weight_bytes / cpu_bandwidth * 1e3  # reading the weights once
token_ms = 2 * params_count / cpu_flops * 1e3  # one token's arithmetic
roofline = [b / max(bytes_ms, b * token_ms) * 1e3 for b in batch_sizes]  # tokens/s: the slower of the two costs
theory_crossover = bytes_ms / token_ms

sizes = torch.tensor(batch_sizes, dtype=torch.float64)
fit = torch.linalg.lstsq(torch.stack([torch.ones_like(sizes), sizes], 1),  # [batches, 2]
                         torch.tensor(decode_ms, dtype=torch.float64)[:, None]).solution.flatten().tolist()
fixed_ms, per_request_ms = fit

fig = go.Figure([go.Scatter(x=batch_sizes, y=throughput, mode="lines+markers", name="measured, your policy"),
                 go.Scatter(x=batch_sizes, y=roofline, mode="lines", line_dash="dot",
                            name="roofline: batch / max(bytes time, batch × FLOPs time per token)"),
                 go.Scatter(x=[theory_crossover] * 2, y=[min(throughput), max(roofline)], mode="lines",
                            line_dash="dash", name="the roofline's crossover")])
fig.update_layout(title=f"Decode throughput against batch size, {MODEL} on this CPU", xaxis_type="log",
                  yaxis_type="log", xaxis_title="requests decoding in the step", yaxis_title="tokens/s",
                  height=380)
fig.show()
print(f"roofline: bytes time {bytes_ms:.1f} ms per step, FLOPs time {token_ms:.2f} ms per token;  measured fit: "
      f"{fixed_ms:.1f} ms + {per_request_ms:.2f} ms × batch")
print("batch  ms per step  tokens/s  roofline tokens/s  measured / roofline")
for b, ms, tps, roof in zip(batch_sizes, decode_ms, throughput, roofline):
    print(f"{b:5d}  {ms:11.1f}  {tps:8.1f}  {roof:17.1f}  {tps / roof:19.2f}")
if fixed_ms <= 0 or per_request_ms <= 0:
    print("the fit has a part at or below zero (a noisy run): run the cell again on a quieter machine")
else:
    compare(f"the batch where a decode step of {MODEL} turns compute-bound", MY_PREDICTION,
            theory=theory_crossover, measured=fixed_ms / per_request_ms, unit="requests",
            theory_name="roofline crossover",
            gap=f"a step's fixed part took {fixed_ms / bytes_ms:.2f}x the time to read the weights at the copy's "
                f"bandwidth, and each request added {per_request_ms / token_ms:.2f}x one token's arithmetic at the "
                "matmul's FLOP/s: the crossover moves by the ratio of the two")
print(f"on your run, a batch of {batch_sizes[-1]} decodes {throughput[-1] / throughput[0]:.1f}x the tokens/s of "
      f"a single request; the roofline allows {roofline[-1] / roofline[0]:.1f}x")

# %% [markdown]
# Read the curve against the roofline, and the table's last column. At small batches the measured
# throughput climbs with the batch: the weights are read once per step, and every request in the
# step shares that read. Past the crossover, each request added costs its own arithmetic, and the
# curve flattens. Where did your measured crossover fall against the roofline's, and which of the
# two parts in the last printed sentence moved it? A fixed part above the bytes time means the
# step costs more than reading the weights (a slower read, or overheads of its own: sampling,
# bookkeeping); a per-request part above the FLOPs time means small products and attention run
# slower than one large matmul. Compare the fit with the cost model of all steps above, too.
# (The FLOP/s comes from one 1024 × 1024 matmul: the engine's matmuls can run a little faster or
# slower than it, and a busy machine measures it low, so at the largest batches the measured curve
# may touch or pass the roofline.) A GPU streaming a 7B model has the same shape, with the turn at
# a far larger batch, since its FLOP/s are so much larger than its bandwidth: compute its
# crossover from lab 00's H100 profile.
#
# Two effects of this machine can show up at small batches. The measured curve can stay well below
# the roofline there: the engine's step also samples and does its bookkeeping, and small matrix
# products reach neither the copy's bandwidth nor a large matmul's FLOP/s. And a few rows are a
# shape that matrix libraries handle badly: with one row the library runs a matrix-vector kernel
# that streams the weights fast; with 2 to a few dozen rows its matrix-matrix kernel may repack
# the weight on every call, and so stream it twice. The engine's linear layers
# (`minillm/layers/linear.py`) avoid that: for 2 to 48 rows they use a copy of the weight that
# oneDNN packed once, and for one row the engine measures, when it loads a big model, which
# layout is faster on this CPU, and uses the winner. Look at your table: does a step of 2 or 4
# requests cost much more than a step of one?
#
# ## How production engines do it (~5 min)
#
# * **Orca** (OSDI 2022) introduced iteration-level scheduling and *selective batching*: the
#   token-wise parts of the model (matmuls, norms) run on the flattened batch, attention per
#   sequence, exactly the split of your `flatten_batch`.
# * **vLLM** schedules continuously with a token budget (`max_num_batched_tokens`) and a sequence
#   cap (`max_num_seqs`). Its V1 scheduler does not even distinguish prefill from decode: each
#   request has a number of computed tokens and a target, and each step gives tokens to requests
#   under the budget, which makes chunked prefill, prefix caching and speculative decoding fit one
#   rule. When blocks run out it preempts by recomputation, newest first.
# * **Sarathi-Serve** (OSDI 2024) made chunked prefill and *stall-free* batching the default answer
#   to the throughput/latency trade-off: decodes first, prefill chunks fill the budget.
# * **SGLang** schedules continuously as well, with a radix-tree prefix cache, and can order the
#   waiting queue to maximise prefix reuse; it overlaps the CPU scheduling of the next step with the
#   GPU running the current one.
# * **Disaggregation** (DistServe, Splitwise, Mooncake) goes further: prefill and decode run on
#   different GPUs, so neither can stall the other; the KV cache travels between them (coming in lab 09).
