# %% [markdown]
# # Lab 04 · Batching and scheduling
#
# **Time:** about 100 minutes. **You need:** lab 02 (prefill and decode) and lab 03 (block tables).
#
# A decode step reads every weight of the model to produce one token per sequence. Reading them
# once for 32 sequences costs little more than reading them for one, so **batching** is where an
# engine's throughput comes from. *How* requests are batched decides the latency: who waits for
# whom, and for how long. Every step, an engine's **scheduler** answers one question: which
# sequences run now, and how many tokens does each compute?
#
# In this lab you write the answers engines have given, from the simplest to what vLLM and SGLang do
# today: static batches, iteration-level (continuous) batching under a token budget, chunked
# prefill, and preemption when KV memory runs out. Then you flatten a step into the tensors the
# model runs on, and measure each policy, first on a simulated clock and then on `minillm`.
#
# ## Learning objectives
# By the end you can
# 1. explain why a static batch wastes its slots and how continuous batching (Orca) fixes it;
# 2. schedule one step under a token budget, running sequences first, and split a long prompt into chunks;
# 3. choose which sequence to preempt when the KV pool is full, and say why the newest;
# 4. flatten a step's sequences into one padding-free batch: input ids, positions, `cu_seqlens`, slot mapping;
# 5. read a Gantt chart of steps × requests, and measure throughput and latency percentiles per policy.
#
# ## How this lab works
# Write code only in the exercise cells (they contain `raise NotImplementedError`), keeping names
# and signatures. Run each `check(...)` cell for feedback; `make grade LAB=04` grades the notebook.
# `minillm/engine/scheduler.py` and `minillm/engine/runner.py` hold the engine's version: read them
# after you finish.

# %% tags=["setup"]
import math
from collections import deque
from dataclasses import dataclass

import torch
from torch import Tensor

from minillm.labkit import check


@dataclass(eq=False)  # eq=False: requests are compared by identity
class Request:
    """A request as the scheduler sees it (no model needed: only the counts matter)."""
    rid: int
    prompt_len: int
    output_len: int          # tokens it generates before it stops
    arrival: float = 0.0     # seconds, on the simulated clock
    computed: int = 0        # tokens whose K/V are in the cache
    generated: int = 0       # output tokens so far

    @property
    def length(self) -> int:
        """Tokens known so far: the prompt and the tokens generated."""
        return self.prompt_len + self.generated

    @property
    def remaining(self) -> int:
        """Tokens to compute before it can sample again: the rest of its prompt, or 1 to decode."""
        return self.length - self.computed

    @property
    def done(self) -> bool:
        return self.generated >= self.output_len


# %%
import time

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from minillm import LLM, SamplingParams
from minillm.bench.chunked import percentile

torch.set_num_threads(1)  # small model, small steps: one thread avoids thread-pool overhead

# %% [markdown]
# ## The concept: a step, and what it costs
#
# A scheduler's decision for one step is a list of `(request, tokens to compute)` pairs. After the
# step runs, each request has `computed` more tokens in its cache, and a request whose step reached
# the end of its known tokens **samples** one new token:
#
# * a request with its whole prompt still to compute **prefills** (many tokens, then its first
#   output token: that sets the time to first token);
# * a request with one token to compute **decodes** (one token in, one token out).
#
# The function below plays one step on the `Request` counters; everything in this lab runs on it.

# %%
def run_step(batch: list[tuple[Request, int]]) -> list[Request]:
    """Apply one step's work; -> the requests that sampled a token in it."""
    sampled = []
    for r, n in batch:
        r.computed += n
        if r.computed == r.length:  # reached its last known token: its logits give a new one
            r.generated += 1
            sampled.append(r)
    return sampled


r = Request(0, prompt_len=5, output_len=3)
for step in range(4):
    print(f"step {step}: computes {r.remaining} token(s)", end=" -> ")
    run_step([(r, r.remaining)])
    print(f"computed {r.computed}, generated {r.generated}, done {r.done}")

# %% [markdown]
# ## Exercise 4.1 · A static batcher
#
# The simplest batcher takes up to `max_num_seqs` waiting requests, prefills them together, then
# decodes them together until **every** one has finished; only then does it take the next batch.
# This is what `model.generate(padded_batch)` does. The caller removes each request from `running`
# as soon as it is done, but its slot stays empty: nobody joins a static batch while it runs.
#
# `waiting` is a queue (first come, first served), `running` a list in admission order. The
# function *moves* the requests it admits from `waiting` to `running`.

# %% exercise="4.1"
def static_step(running: list[Request], waiting: deque[Request], max_num_seqs: int) -> list[tuple[Request, int]]:
    """One step of static batching. -> [(request, tokens to compute)] in running order.

    If any request is running: each computes its `remaining` tokens, and no one is admitted.
    Otherwise: move up to max_num_seqs requests from the front of `waiting` to `running`, each
    computing its whole `remaining` (its prompt).

    Hints: 5 lines. `waiting.popleft()`.
    """
    ### BEGIN SOLUTION
    if not running:
        while waiting and len(running) < max_num_seqs:
            running.append(waiting.popleft())
    return [(r, r.remaining) for r in running]
    ### END SOLUTION


# %%
check("4.1")

# %% [markdown]
# ## Continuous batching and the token budget
#
# **Iteration-level scheduling** (Orca, Yu et al. 2022) decides the batch again at *every step*: a
# finished request leaves at once, and a waiting one takes its place in the next step. No slot
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
# A prompt of `prompt_len` tokens arrives while `num_decodes` requests are decoding. Each step the
# decodes take one token of the budget each, and the prompt's chunk gets the rest. Every chunk is
# full except perhaps the last, which takes what is left of the prompt (never drop it: those tokens
# need their K/V too).

# %% exercise="4.2"
def prefill_chunks(prompt_len: int, budget: int, num_decodes: int) -> list[int]:
    """The chunk sizes of a prompt's prefill, step by step, next to num_decodes decodes.

    chunk = budget - num_decodes tokens per step, the last chunk the remainder;
    sum(chunks) == prompt_len. Raises ValueError if budget - num_decodes < 1 (no room to progress).

    Hints: 5 lines. `divmod`, or a while loop with `min`.
    """
    ### BEGIN SOLUTION
    size = budget - num_decodes
    if size < 1:
        raise ValueError(f"a budget of {budget} tokens leaves no room for a prefill next to {num_decodes} decodes")
    full, last = divmod(prompt_len, size)
    return [size] * full + ([last] if last else [])
    ### END SOLUTION


# %%
check("4.2")
print(prefill_chunks(100, budget=32, num_decodes=6))

# %% [markdown]
# ## Exercise 4.3 · One continuous-scheduling step
#
# Now the whole decision, as `minillm`'s scheduler makes it:
#
# 1. **Running requests first**, oldest first: each wants its `remaining` tokens (1 to decode, or
#    the rest of a prompt being prefilled in chunks). With chunking, it takes `min(remaining, left)`
#    where `left` is the budget not yet spent. A request that gets 0 tokens, or (unchunked) wants
#    more than is left, sits this step out, unless the batch is still empty: then it runs alone,
#    over budget, since a prompt longer than the budget could otherwise never run.
# 2. **Then waiting requests join**, first come first served, while fewer than `max_num_seqs` run
#    and budget is left: each wants its `remaining` (its prompt), cut to `left` when chunking.
#    Unchunked, a prompt larger than what is left stops admission for this step (unless the batch
#    is empty); nobody behind it jumps the queue.
#
# Running requests go first because they already hold KV memory and someone is waiting for their
# next token; a new prompt can wait a step. The budget is inclusive: a step may compute exactly
# `budget` tokens.

# %% exercise="4.3"
def continuous_step(running: list[Request], waiting: deque[Request], budget: int, max_num_seqs: int,
                    chunked: bool = True) -> list[tuple[Request, int]]:
    """One step of continuous batching under a token budget. -> [(request, tokens to compute)].

    Running requests in order, then admitted ones (moved from the front of `waiting` to the end
    of `running`), following the rules above; the tokens of the step sum to at most `budget`
    (except for a lone over-budget request when unchunked).

    Hints: about 20 lines. Keep `left = budget - tokens scheduled so far`.
    """
    ### BEGIN SOLUTION
    batch, left = [], budget
    for r in running:
        n = min(r.remaining, left) if chunked else r.remaining
        if n == 0 or (n > left and batch):
            continue
        batch.append((r, n))
        left -= n
    while waiting and len(running) < max_num_seqs and left > 0:
        r = waiting[0]
        n = min(r.remaining, left) if chunked else r.remaining
        if n > left and batch:
            break
        running.append(waiting.popleft())
        batch.append((r, n))
        left -= n
    return batch
    ### END SOLUTION


# %%
check("4.3")

# %% [markdown]
# ## Exercise 4.4 · Preemption: who gives up their memory?
#
# Continuous batching admits requests while their *prompts* fit, betting that blocks will free up
# as others finish. Sometimes the bet fails: a running request needs a new block for its next
# token and the pool is empty. Something must give. `minillm` and vLLM **preempt** the **newest**
# running request: free its blocks and put it back at the front of the queue, to be *recomputed*
# later (its tokens are kept, its K/V are not). Repeat until the needy request's blocks fit, or
# until the needy request is itself the newest, and so is preempted.
#
# Why the newest? It has done the least work, so recomputing it costs least, and preempting it
# keeps first-come-first-served fairness: the oldest requests finish first. (vLLM also offers
# *swapping* K/V to CPU memory instead of recomputing.)

# %% exercise="4.4"
def preempt_for(needy: Request, blocks_needed: int, running: list[Request], waiting: deque[Request],
                num_free: int, block_size: int) -> list[Request]:
    """Preempt the newest running requests until `needy` can get blocks_needed blocks.

    While blocks_needed > num_free: the victim is the last of `running`; remove it, free its
    ceil(victim.computed / block_size) blocks (num_free grows), set victim.computed = 0, and put
    it at the front of `waiting`. Stop after preempting `needy` itself.
    -> the victims, in the order preempted (newest first).

    Hints: 9 lines. `running.pop()`, `waiting.appendleft(victim)`, `math.ceil`.
    """
    ### BEGIN SOLUTION
    victims = []
    while blocks_needed > num_free and running:
        victim = running.pop()
        num_free += math.ceil(victim.computed / block_size)
        victim.computed = 0
        waiting.appendleft(victim)
        victims.append(victim)
        if victim is needy:
            break
    return victims
    ### END SOLUTION


# %%
check("4.4")

# %% [markdown]
# ## Exercise 4.5 · Flattening a step into one batch
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
# * `slot_mapping [T]`: where each token's K/V go in the paged pool (lab 03's formula).
#
# ```
#  seq 0: prefill chunk, computed 4, 3 tokens   seq 1: decode, computed 9    seq 2: decode, computed 2
#  input_ids   t4  t5  t6 | u9 | v2               cu_seqlens [0, 3, 4, 5]
#  positions    4   5   6 |  9 |  2
# ```

# %% exercise="4.5"
def flatten_batch(token_ids: list[list[int]], computed: list[int], num_tokens: list[int],
                  block_tables: list[list[int]], block_size: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Flatten one step's B sequences into a padding-free batch of T = sum(num_tokens) tokens.

    Sequence i computes its tokens computed[i] .. computed[i] + num_tokens[i] - 1 (of token_ids[i]).
    -> input_ids [T], positions [T], cu_seqlens [B + 1], slot_mapping [T], all int64;
       slot of position t of sequence i = block_tables[i][t // block_size] * block_size + t % block_size.

    Hints: about 10 lines. One loop over the sequences; `torch.tensor`, `torch.cumsum`.
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
# ## Measure it on a simulated clock
#
# A cost model first, so that the policies can be compared without noise: a step costs a fixed
# time to read the weights, plus a time per token computed,
#
# `step time = 8 ms + 0.08 ms × tokens`,
#
# roughly a 7B model on one GPU: decode steps are memory-bound (the fixed part), big prefills
# compute-bound (the per-token part). Twelve requests arrive over the first 0.15 s, with prompts
# and answers of mixed lengths. Each policy plays the same workload with your functions:
#
# * **sequential**: one request at a time (a static batch of 1);
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
    "sequential": lambda run, wait: static_step(run, wait, 1),
    "static": lambda run, wait: static_step(run, wait, 6),
    "continuous": lambda run, wait: continuous_step(run, wait, budget=512, max_num_seqs=6, chunked=False),
    "continuous + chunked": lambda run, wait: continuous_step(run, wait, budget=64, max_num_seqs=6),
}

# %% [markdown]
# The simulator: requests join the queue when the clock passes their arrival; each step asks the
# policy for a plan, charges its cost, and records who computed what and when each token came out.

# %%
def simulate(policy) -> dict:
    """Play the workload on the simulated clock; -> steps [(start, seconds, [(rid, n, phase)])] and
    each request's arrival and token times."""
    pending, waiting, running = deque(make_workload()), deque(), []
    clock, steps, times = 0.0, [], {}
    while pending or waiting or running:
        while pending and pending[0].arrival <= clock:
            waiting.append(pending.popleft())
        batch = policy(running, waiting)
        if not batch:  # nothing to do until the next arrival
            clock = pending[0].arrival
            continue
        work = [(r.rid, n, "prefill" if r.computed < r.prompt_len else "decode") for r, n in batch]
        seconds = step_seconds(sum(n for _, n in batch))
        clock += seconds
        for r in run_step(batch):
            times.setdefault(r.rid, []).append(clock)
        running[:] = [r for r in running if not r.done]
        steps.append((clock - seconds, seconds, work))
    arrivals = {r.rid: r.arrival for r in make_workload()}
    return {"steps": steps, "arrivals": arrivals, "times": times}

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
        print(f"{name:>22} {s['output tok/s']:7.0f} " + " ".join(
            f"{s[k] * 1e3:{w}.0f}" for k, w in (("TTFT p50", 9), ("TTFT p90", 9), ("ITL p50", 8), ("ITL p99", 8), ("E2E p90", 8)))
            + "   (ms)")


def gantt(runs: dict, title: str) -> go.Figure:
    """One row of subplots per policy: a bar per (request, step), prefill chunks vs decodes."""
    fig = make_subplots(rows=len(runs), cols=1, shared_xaxes=True, subplot_titles=list(runs), vertical_spacing=0.04)
    for row, (name, steps) in enumerate(runs.items(), 1):
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
print_summaries({name: summary(s["arrivals"], s["times"], s["steps"][-1][0] + s["steps"][-1][1])
                 for name, s in sims.items()})

# %% [markdown]
# Read the chart row by row:
#
# * **sequential** is one long line of single requests: every step reads all the weights for one
#   token. Throughput is the worst, and requests arriving later wait for all before them.
# * **static** batches well at first, but each batch ends in a tail where one long answer decodes
#   alone while the rest of the batch's slots stay empty, and newcomers wait for the whole batch.
# * **continuous** fills a slot as soon as it frees: the highest throughput and the lowest TTFT.
#   But look at the red bars: a step with a big prefill takes several times longer, and every
#   request decoding in it waits too. That is the ITL p99.
# * **continuous + chunked** cuts those prefills into chunks next to the decodes: no step is long,
#   so the tail inter-token latency drops. The price is paid by the new prompts, whose prefill now
#   spreads over several steps (their TTFT rises), and by a little throughput (more steps, each
#   paying the fixed cost). The budget is the knob between the two.

# %% [markdown]
# ## Measure it on the real engine
#
# Now the same comparison on `minillm`, read from its telemetry: `engine.subscribe(observer)`
# registers a function that the engine calls after every step with a `StepEvent` (when the step
# started, how long it took, and what it scheduled: a `ScheduledWork` per sequence, with its
# tokens and whether they were prefill or decode). The requests all arrive at once here, an
# offline batch. A step of this small model on this CPU takes a few milliseconds; every number is
# measured, so expect noise (this machine may be shared) and read the ratios.

# %%
llm_policies = {
    "sequential": dict(scheduler="sequential"),
    "static": dict(scheduler="static", max_num_seqs=6),
    "continuous": dict(scheduler="continuous", max_num_seqs=6, max_num_batched_tokens=512, enable_chunked_prefill=False),
    "continuous + chunked": dict(scheduler="continuous", max_num_seqs=6, max_num_batched_tokens=64),
}
workload = make_workload()
params = [SamplingParams(max_tokens=r.output_len, temperature=0, ignore_eos=True) for r in workload]


def measure(config: dict, repeats: int = 2) -> dict:
    """The fastest of `repeats` runs (other processes on this machine only ever slow a run down)."""
    llm = LLM("tiny", **config)
    gen = torch.Generator().manual_seed(1)  # the same random prompts for every policy
    prompts = [torch.randint(1, llm.model.config.vocab_size, (r.prompt_len,), generator=gen).tolist() for r in workload]
    llm.generate(prompts[:2], params[:2])  # warm-up
    events, best = [], None
    llm.engine.subscribe(events.append)
    for _ in range(repeats):
        first, start = len(events), time.perf_counter()
        outs = llm.generate(prompts, params)  # all arrive at once: an offline batch
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
gantt({name: r["steps"] for name, r in real.items()}, "minillm on this machine: steps × requests").show()
print_summaries({name: r["summary"] for name, r in real.items()})
print("greedy outputs identical across policies:", all(r["outputs"] == real["sequential"]["outputs"] for r in real.values()))

# %% [markdown]
# **Preemption, for real.** Shrink the KV pool to 30 blocks of 16 slots (480 tokens, fewer than two
# of the longest requests need) and run the chunked policy again. The scheduler admits requests
# while their prompts fit; when a running request then needs a block and none is free, the newest
# is preempted and later recomputed: look for a request whose prefill bars come back after its
# decodes started. Nothing is lost, and greedy outputs do not change.

# %%
tight = measure({**llm_policies["continuous + chunked"], "num_kv_blocks": 30}, repeats=1)
print(f"preemptions: {tight['preemptions']}; outputs identical to the roomy pool: "
      f"{tight['outputs'] == real['continuous + chunked']['outputs']}")
gantt({"continuous + chunked, a 30-block KV pool": tight["steps"]}, "Preempted requests prefill again").show()
print_summaries({"roomy pool": real["continuous + chunked"]["summary"], "30-block pool": tight["summary"]})

# %% [markdown]
# **This machine's cost model.** Fit `step time = fixed + per_token × tokens` to every measured step
# above (least squares), and compare it with the one the simulation assumed.

# %%
tokens = torch.tensor([sum(n for _, n, _ in work) for r in real.values() for _, _, work in r["steps"]], dtype=torch.float64)
seconds = torch.tensor([d for r in real.values() for _, d, _ in r["steps"]], dtype=torch.float64)
design = torch.stack([torch.ones_like(tokens), tokens], 1)  # [steps, 2]
fixed, per_token = torch.linalg.lstsq(design, seconds[:, None]).solution.flatten().tolist()
print(f"this machine: step ≈ {fixed * 1e3:.2f} ms + {per_token * 1e3:.3f} ms × tokens;  "
      f"simulated: 8 ms + 0.080 ms × tokens")
print(f"the per-token part equals the fixed part at {fixed / per_token:.0f} tokens here, at 100 in the simulation")
fig = go.Figure([go.Scatter(x=tokens, y=seconds * 1e3, mode="markers", name="measured steps", opacity=0.5),
                 go.Scatter(x=[0, float(tokens.max())], y=[fixed * 1e3, (fixed + per_token * float(tokens.max())) * 1e3],
                            name="fit")])
fig.update_layout(title="Step time vs tokens computed, minillm on this machine", xaxis_title="tokens in the step",
                  yaxis_title="ms", height=320)
fig.show()

# %% [markdown]
# Compare the measured tables with the simulated one. The big orderings carry over: sequential is
# the slowest, static batches idle in their tails, continuous batching gives the most tokens per
# second and the shortest TTFT. The finer ones may not, and the fit says why: on this CPU the
# per-token part catches up with the fixed part after far fewer tokens than in the GPU-like model
# we simulated. So a batch of decodes costs clearly more than one decode (batching buys less than
# on a GPU, where 64 decodes cost about what one does), and chunking's extra steps, each paying
# the fixed part, weigh relatively more. Put the fitted numbers into `step_seconds` and run the
# simulation again: it should now come much closer to this machine.
# `python -m minillm.bench throughput` and `python -m minillm.bench chunked` run larger,
# repeated versions of these measurements.
#
# ## How production engines do it
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
#   different GPUs, so neither can stall the other; the KV cache travels between them (lab 09).
