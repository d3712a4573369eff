# %% [markdown]
# # Lab 09 · Scaling out
#
# **Time:** about 145 minutes (each section's heading gives its share). **You need:** lab 00 (the
# roofline: what a step costs), lab 03 (paged KV blocks and the prefix cache), lab 06 (int8 weights)
# and lab 08 (TTFT, TPOT, ITL, goodput and SLOs). **See also:** the visualizer's **Cluster** page
# (`make app`), which runs the same simulator with sliders, and `docs/scaling.md`.
#
# One engine on one GPU serves one model up to a point. Past it there are two ways out: split the
# **model** over several GPUs (tensor parallelism), or run many **copies** of the engine behind a
# router, and maybe split the two phases of a request over different machines (disaggregated
# prefill and decode). Each way trades something: bytes on a link, cache hits, idle machines.
# This lab builds the small parts that decide those trades, each with the interface of the piece
# it plugs into, and measures the trades in `minillm`'s cluster simulator (`minillm/sim/`). The
# main experiment calibrates that simulator on **your** engine: a step profile of SmolLM2 on your
# machine, one replica predicted and then measured, the same weights under three configurations,
# and a fleet planned on paper from your own step costs.
#
# | exercise | your part | runs inside |
# | --- | --- | --- |
# | 9.1 | `shard_columns`, `shard_rows`: one rank's slice of a weight | a 2-rank gloo run |
# | 9.2 | `tp_mlp_forward`: where the all-reduce goes | a 2-rank gloo run |
# | 9.3 | `pack_kv`, `unpack_kv`: KV blocks on the wire | two engines' KV pools |
# | 9.4 | `PrefixAware`: a cache-aware routing policy | the simulator and the real router |
# | 9.5 | `autoscale_rule`: how many replicas to run | the simulator's autoscaler |
# | 9.6 | `allreduce_bytes_per_token`: what TP costs on the link | the capacity plan |
#
# ## Learning objectives
# By the end you can
# 1. shard a linear layer by columns or by rows, and say which needs an all-reduce and why;
# 2. run a tensor-parallel MLP with exactly one all-reduce, and compute the bytes it moves;
# 3. move a sequence's KV cache from one engine to another without sending a single empty slot;
# 4. route requests to the replica that holds their prefix, without overloading it;
# 5. scale a fleet up and down without flapping, and price the result in replica-seconds;
# 6. calibrate a simulator on your own engine, check it against a real run, and plan how many
#    replicas a given traffic needs at a given SLO, and read the plan critically;
# 7. explain from a step profile why the same weights serve faster or slower under another configuration.
#
# ## How this lab works
# Write code only in the exercise cells (they contain `raise NotImplementedError`), keeping names
# and signatures. Run each `check(...)` cell for feedback. `make grade LAB=09` grades the notebook,
# and like `check("9.E")` near the end it runs your parts **inside the real pieces**: two ranks
# talking over `torch.distributed` (gloo), two engines' KV pools, the cluster simulator, the
# router's replica picker. The engine's versions are in `minillm/router/policies.py` and
# `minillm/sim/autoscale.py` (and `minillm/tp/`, `minillm/disagg/`): read them after you finish.

# %% tags=["setup"]
import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from minillm.labkit import check
from minillm.sim.autoscale import FleetState
from minillm.router.policies import ReplicaView

# %%
import plotly.graph_objects as go

from minillm.perf import PROFILES, model_shape
from minillm.sim import SimRequest, StepProfile, simulate
from minillm.sim.autoscale import Autoscaler, fixed_rule, queue_rule
from minillm.sim.plan import replicas_needed, summary
from minillm.sim.workloads import agent_sessions
from minillm.labkit import quick_run

QUICK = quick_run()  # True under the test suite: smaller simulations and measurements, the same method

torch.set_num_threads(1)  # small tensors on a shared CPU: one thread avoids fighting over the cores

# %% [markdown]
# ## Tensor parallelism: one layer over several GPUs (~5 min)
#
# A linear layer computes `y = x Wᵀ`, with `W` stored as PyTorch stores it: `[out_features,
# in_features]`. Split it over `world` GPUs (ranks) in one of two ways (Megatron-LM, Shoeybi et
# al. 2019):
#
# * **column-parallel**: rank `r` keeps a block of **output features**, rows `r·out/world …
#   (r+1)·out/world` of `W`. Every rank needs the whole input `x` and computes its own slice of
#   `y`: `y_r = x W_rᵀ`. No communication: the slices sit side by side.
# * **row-parallel**: rank `r` keeps a block of **input features**, columns `r·in/world …` of `W`,
#   and sees only the matching slice of `x`. Each rank computes a *partial sum* of the whole `y`:
#   `y = Σ_r x_r W_rᵀ`. The ranks must add their partials: an **all-reduce** (every rank ends with
#   the sum).
#
# (The names come from the math convention `y = x A` with `A = Wᵀ`: a column-parallel layer splits
# the columns of `A`, i.e. the rows of our `W`.)

# %% [markdown]
# ## Exercise 9.1 · Shard a weight (~10 min)
#
# Split evenly: each rank gets `size / world` consecutive features, rank 0 the first ones. Refuse
# a `world` below 1 or that does not divide the size, and a rank outside `0 … world-1`, with a
# `ValueError` that says the values. Return a contiguous **copy**, in the weight's dtype: a real
# rank keeps only its shard in memory, and a view would keep the whole weight alive (and see every
# later write to it). Mind that `.contiguous()` is not a copy when the slice already is contiguous:
# a block of rows of a row-major weight is, so `weight[a:b].contiguous()` is the view itself.
# `.clone()` always copies.

# %% exercise="9.1"
def shard_columns(weight: Tensor, rank: int, world: int) -> Tensor:
    """Rank `rank`'s shard of a column-parallel linear layer: its block of output features, as the rules
    above say (consecutive, equal blocks, rank 0 first).

    weight: a 2-D tensor [out_features, in_features], any dtype and device. -> a 2-D tensor with the
    rank's share of the output features and every input feature: a contiguous copy in weight's dtype,
    sharing no memory with weight (even for world 1). weight is not changed.
    Raises ValueError (saying the values) for a world below 1 or one that does not split the output
    features evenly, and for a rank outside the world.
    """
    ### BEGIN SOLUTION
    out_features = weight.shape[0]
    if world < 1 or out_features % world:
        raise ValueError(f"world must be >= 1 and divide the {out_features} features, got world={world}")
    if not 0 <= rank < world:
        raise ValueError(f"rank must be in 0..{world - 1}, got {rank}")
    part = out_features // world
    return weight[rank * part:(rank + 1) * part].clone(memory_format=torch.contiguous_format)
    ### END SOLUTION


def shard_rows(weight: Tensor, rank: int, world: int) -> Tensor:
    """Rank `rank`'s shard of a row-parallel linear layer: its block of input features, every output
    feature; a contiguous copy as shard_columns returns. Raises ValueError as shard_columns does, for the
    input features.
    """
    ### BEGIN SOLUTION
    return shard_columns(weight.T, rank, world).T.contiguous()
    ### END SOLUTION


# %%
w = torch.arange(24.0).reshape(4, 6)  # 4 output features, 6 input features
print("column shard of rank 1 of 2:\n", shard_columns(w, 1, 2))
print("row shard of rank 1 of 3:\n", shard_rows(w, 1, 3))

# %% [markdown]
# <details><summary>Hint 1: a nudge</summary>
#
# Refuse the bad arguments first. Then: how many rows does each rank get, and where does rank r's block start?
# </details>
# <details><summary>Hint 2: the idea</summary>
#
# A slice of rows is a view: copy it, and make sure the copy is contiguous (a row shard's slice of columns
# is not). The columns of a weight are the rows of its transpose: one function can serve both.
# </details>
# <details><summary>Hint 3: last resort</summary>
#
# part = size // world; the block is part·rank … part·(rank + 1); `clone` with the contiguous memory format.
# </details>

# %%
check("9.1")

# %% [markdown]
# ## Exercise 9.2 · Where the all-reduce goes (~10 min)
#
# The MLP of a Llama layer (`minillm/layers/mlp.py`) is `down(silu(gate(x)) · up(x))`, with
# `gate` and `up` fused into one weight `gate_up: [2·I, H]` (the gate's I rows, then the up's I
# rows) and `down: [H, I]`. Megatron's recipe needs **one** all-reduce for the whole MLP. Find
# where it goes by asking, of each operation, what a rank can compute from its own shards:
#
# * a column-parallel layer gives each rank a *slice of features* of its output, complete: no
#   communication needed to use them element by element, as long as the slices line up;
# * an element-wise function of two tensors (`silu(a) · b`) needs, for each feature, that feature
#   of both tensors on the same rank;
# * a row-parallel layer takes a slice of features of its input and gives a *partial sum* of its
#   whole output: useless until the ranks' partials are added.
#
# A worked example on another function, `y = C (relu(A x))` with A column-parallel and C
# row-parallel over 2 ranks: rank 0 computes features 0 … k−1 of `A x`, applies relu to them (an
# element-wise function needs nothing else), and multiplies by its columns of C: a partial `y₀`;
# rank 1 likewise `y₁`; `y = y₀ + y₁`, one all-reduce at the very end. Now the SwiGLU MLP: which
# slices of the gate and of the up must one rank hold for `silu(gate) · up` to be element-wise on
# it? (Shard the fused weight as one `[2I, H]` matrix and rank 0 gets the whole gate and no up.)
#
# An all-reduce earlier, on the gate/up slices, would add slices of *different* features (wrong);
# one after each layer would send twice the bytes for nothing. Here the ranks are simulated: your
# function computes every rank's part in turn and calls `all_reduce(partials)` (given), which
# returns, for each rank, the sum of all ranks' tensors, as `torch.distributed.all_reduce` does.
# The check counts the calls and looks at what you pass.

# %% exercise="9.2"
def tp_mlp_forward(x: Tensor, gate_up: Tensor, down: Tensor, world: int,
                   all_reduce: Callable[[list[Tensor]], list[Tensor]]) -> Tensor:
    """The SwiGLU MLP, tensor-parallel over `world` simulated ranks, as Megatron places it.

    x: [tokens, H]; gate_up: [2 * I, H] (the gate's I rows, then the up's); down: [H, I]; world divides I.
    Each rank computes only from its own shards (your 9.1 functions); all_reduce (given: a list of one
    tensor per rank -> a list of their sums) is called exactly once, with one [tokens, H] tensor per rank.
    -> rank 0's result [tokens, H], equal to the unsharded MLP up to float rounding. No argument is changed.
    """
    ### BEGIN SOLUTION
    gate, up = gate_up.chunk(2)
    partials = []
    for rank in range(world):
        g = x @ shard_columns(gate, rank, world).T   # [tokens, I / world]
        u = x @ shard_columns(up, rank, world).T     # [tokens, I / world]
        partials.append((F.silu(g) * u) @ shard_rows(down, rank, world).T)  # [tokens, H], a partial sum
    return all_reduce(partials)[0]
    ### END SOLUTION


# %%
def simulated_all_reduce(tensors: list[Tensor]) -> list[Tensor]:
    """Every rank gets the sum of every rank's tensor (what torch.distributed.all_reduce does, in place)."""
    total = torch.stack(tensors).sum(0)
    return [total.clone() for _ in tensors]


gen = torch.Generator().manual_seed(0)
x, gate_up, down = (torch.randn(*s, generator=gen) for s in ((5, 16), (2 * 24, 16), (16, 24)))
g, u = (x @ gate_up.T).chunk(2, dim=-1)
reference = (F.silu(g) * u) @ down.T
for world in (1, 2, 4):
    got = tp_mlp_forward(x, gate_up, down, world, simulated_all_reduce)
    print(f"world {world}: largest difference from the unsharded MLP {(got - reference).abs().max():.2e}")

# %% [markdown]
# <details><summary>Hint 1: a nudge</summary>
#
# Split the fused weight into the gate and the up first; shard each of them, never the fused matrix.
# </details>
# <details><summary>Hint 2: the idea</summary>
#
# Per rank: its gate and up slices give its slice of the activation (no communication); its slice of `down`
# turns that into a partial of the whole output. Collect the partials, reduce them once.
# </details>
# <details><summary>Hint 3: last resort</summary>
#
# partial_r = (silu(x gate_rᵀ) · x up_rᵀ) down_rᵀ, with `down_r` a row shard; return all_reduce(partials)[0].
# </details>

# %%
check("9.2")

# %% [markdown]
# ## Disaggregation: prefill here, decode there (~5 min)
#
# A long prompt's prefill is compute-bound and takes a whole step's budget; decodes are
# memory-bound and want short, regular steps. Sharing one engine, every long prefill stalls the
# decodes batched with it: a user reading a stream sees a hiccup (a long ITL). **Disaggregated**
# serving (DistServe, Zhong et al. 2024; Splitwise; Mooncake, Qin et al. 2024) runs prefill on one
# pool of GPUs and decode on another, and sends each request's KV cache from the first to the
# second. Below, the simulator with a profile of Llama-3.1-8B on an H100 **on paper**: a roofline
# (`StepProfile.from_roofline`) from NVIDIA's H100 SXM datasheet peaks (`minillm/perf/hardware.py`)
# at 60% of peak, not a measurement; later in the lab you calibrate the simulator on your own engine.
# The same bursty mix of long and short prompts on 4 colocated replicas, then on 1 prefill + 3 decode
# replicas.

# %%
llama8b = model_shape("Llama-3.1-8B")
fleet_profile = StepProfile.from_roofline(llama8b, PROFILES["H100 SXM"])


def mixed_prompts(n: int, rate: float, seed: int) -> list[SimRequest]:
    """n requests at `rate` per second (Poisson), one in four a long prompt (4000-8000 tokens)."""
    gen = torch.Generator().manual_seed(seed)
    gaps = torch.empty(n).exponential_(rate, generator=gen)
    out = []
    for i, t in enumerate(gaps.cumsum(0).tolist()):
        long = torch.rand(1, generator=gen).item() < 0.25
        prompt = int(torch.randint(4000, 8000, (1,), generator=gen)) if long else int(torch.randint(100, 600, (1,),
                                                                                                    generator=gen))
        out.append(SimRequest(t, prompt, int(torch.randint(100, 300, (1,), generator=gen)), request_id=f"r{i}"))
    return out


rows = {}
for name, options in (("colocated, 4 replicas", dict(replicas=4)),
                      ("disaggregated, 1 prefill + 3 decode", dict(replicas=3, prefill_replicas=1,
                                                                  transfer_seconds_per_token=2e-6))):
    result = simulate(mixed_prompts(400, 8.0, seed=0), fleet_profile, router="least_loaded",
                      max_num_batched_tokens=8192, kv_blocks=20_000, **options)
    rows[name] = summary(result.requests)
    print(f"{name:>36}: ITL p50 {rows[name]['itl_median'] * 1e3:5.1f} ms, p99 {rows[name]['itl_p99'] * 1e3:6.1f} ms; "
          f"TTFT p50 {rows[name]['ttft_median'] * 1e3:6.0f} ms, p99 {rows[name]['ttft_p99'] * 1e3:6.0f} ms")
fig = go.Figure([go.Bar(name=stat, x=list(rows), y=[rows[k][key] * 1e3 for k in rows])
                 for stat, key in (("ITL p50", "itl_median"), ("ITL p99", "itl_p99"))])
fig.update_layout(title="Inter-token latency, Llama-3.1-8B on H100s (simulated)", yaxis_title="ms", height=320)
fig.show()

# %% [markdown]
# Compare each row's ITL p99 with its p50: the decode pool's steps never hold a prefill, so what
# should happen to its tail? The price is on the other side: one prefill replica serves every
# prompt (look at the TTFTs), and the KV cache must travel (`transfer_seconds_per_token`: here 2 µs a
# token, about 128 KiB a token of Llama-3.1-8B's K/V over an assumed 64 GB/s link). Try
# `prefill_replicas=2`, or a slower link.
#
# ## Exercise 9.3 · KV blocks on the wire (~12 min)
#
# The decode engine receives the prompt's K/V and writes it into **its own** blocks: block ids
# mean nothing across machines. So the prefill side **packs** a sequence's K/V into one contiguous
# buffer (one transfer, not one per block), and the decode side **unpacks** it into the blocks it
# allocated. The pool is laid out as in `minillm/cache/pool.py`: per layer, blocks of
# `block_size` slots, token `t` of the sequence at slot `t % block_size` of block
# `block_table[t // block_size]`.
#
# Send only what is there: the last block is usually partial, and its empty slots are waste on the
# wire (with 16-token blocks and short prompts, up to half the bytes). The buffer holds exactly
# `num_tokens` tokens, in order, K then V.

# %% exercise="9.3"
def pack_kv(k_blocks: Tensor, v_blocks: Tensor, block_table: Sequence[int], num_tokens: int) -> Tensor:
    """One sequence's K and V, gathered from its blocks into one contiguous buffer.

    k_blocks, v_blocks: [layers, num_blocks, block_size, kv_heads, head_dim] (a pool, by block, laid out
    as above); block_table: the sequence's block ids, in token order, exactly as many as its num_tokens
    need. -> a new contiguous [2, layers, num_tokens, kv_heads, head_dim] of the pool's dtype: [0] the
    keys, [1] the values, tokens in order; nothing from the empty slots. The pool is not changed.
    Raises ValueError when the block table's length does not fit num_tokens (say both).
    """
    ### BEGIN SOLUTION
    block_size = k_blocks.shape[2]
    if len(block_table) != -(-num_tokens // block_size):
        raise ValueError(f"{num_tokens} tokens in blocks of {block_size} need {-(-num_tokens // block_size)} "
                         f"blocks, the block table has {len(block_table)}")
    table = torch.as_tensor(list(block_table), dtype=torch.long, device=k_blocks.device)
    k = k_blocks[:, table].flatten(1, 2)[:, :num_tokens]  # [layers, num_tokens, kv_heads, head_dim]
    v = v_blocks[:, table].flatten(1, 2)[:, :num_tokens]
    return torch.stack([k, v]).contiguous()
    ### END SOLUTION


def unpack_kv(buffer: Tensor, k_blocks: Tensor, v_blocks: Tensor, block_table: Sequence[int]) -> None:
    """The inverse of pack_kv: write a packed sequence into these blocks of a pool, in place; -> None.

    buffer: as pack_kv returns it; k_blocks, v_blocks: a pool, by block; block_table: the receiving
    sequence's block ids. Each token's K and V land in the slot the layout gives it; no other slot is
    touched (the rest of the last block, other sequences' blocks). Raises ValueError as pack_kv does.
    """
    ### BEGIN SOLUTION
    num_tokens, block_size = buffer.shape[2], k_blocks.shape[2]
    if len(block_table) != -(-num_tokens // block_size):
        raise ValueError(f"{num_tokens} tokens in blocks of {block_size} need {-(-num_tokens // block_size)} "
                         f"blocks, the block table has {len(block_table)}")
    for i, block in enumerate(block_table):
        start = i * block_size
        n = min(block_size, num_tokens - start)
        k_blocks[:, block, :n] = buffer[0, :, start:start + n]
        v_blocks[:, block, :n] = buffer[1, :, start:start + n]
    ### END SOLUTION


# %%
layers, blocks, block_size, heads, dim = 2, 8, 4, 2, 3
pool_k, pool_v = torch.randn(layers, blocks, block_size, heads, dim), torch.randn(layers, blocks, block_size, heads,
                                                                                   dim)
buffer = pack_kv(pool_k, pool_v, [5, 2, 7], num_tokens=10)  # blocks 5 and 2 full, block 7 holds 2 tokens
print("packed:", tuple(buffer.shape), "-", buffer.numel() * 4, "bytes instead of", 2 * layers * 3 * block_size
      * heads * dim * 4, "for three whole blocks")
other_k, other_v = torch.zeros_like(pool_k), torch.zeros_like(pool_v)
unpack_kv(buffer, other_k, other_v, [0, 1, 3])
print("the same keys in the other pool's blocks 0, 1, 3:",
      torch.equal(pack_kv(other_k, other_v, [0, 1, 3], 10), buffer))

# %% [markdown]
# <details><summary>Hint 1: a nudge</summary>
#
# How many blocks do 10 tokens in blocks of 4 need? Write that count without floats, then refuse a table of
# another length.
# </details>
# <details><summary>Hint 2: the idea</summary>
#
# Packing: index the pool's block dimension with the whole table at once, merge the block and slot dimensions
# into one token dimension, cut at num_tokens. Unpacking cannot write a whole last block: go block by block,
# writing only the tokens that belong to it.
# </details>
# <details><summary>Hint 3: last resort</summary>
#
# Block i of the table holds tokens i·block_size … min((i + 1)·block_size, num_tokens) − 1.
# </details>

# %%
check("9.3")

# %% [markdown]
# ## Routing: which replica serves a request (~3 min)
#
# A router in front of many replicas sees, for each replica, its **load** (requests in flight)
# and, from the prompts it sent there, how many of this request's prompt tokens that replica's
# **prefix cache** likely holds (`minillm/router/prefix_index.py` keeps the same block-hash chains as
# the engine; SGLang's router keeps a radix tree). Agents make this matter: every call of a session
# repeats the whole conversation so far. Send it back to the replica that has it and the prefill is
# a few hundred tokens; send it anywhere else and it is thousands.
#
# Round robin and least-loaded routing are blind to the cache. Pure cache affinity is blind to load:
# a popular tenant's system prompt would pile every request onto one replica. **Cache-aware** routing
# takes the best hit among the replicas whose load is close enough to the lightest one.

# %% [markdown]
# ## Exercise 9.4 · A prefix-aware routing policy (~10 min)
#
# The interface of `minillm/router/policies.py`, shared by the simulator and the real router:
# `choose(replicas, prompt_tokens) -> index`, where `replicas[i]` is a `ReplicaView(load,
# cached_tokens, alive)`. The rule:
#
# 1. only **alive** replicas may be chosen (a dead or draining one gets nothing); none alive:
#    raise `RuntimeError`;
# 2. `lightest` = the smallest load among alive replicas; the **candidates** are the alive replicas
#    with `load <= lightest + slack`;
# 3. among the candidates, the most `cached_tokens`; ties go to the lower load, then the lower index.
#
# (`slack` = 0 is least-loaded with the cache as a tie-breaker; a huge `slack` is pure affinity.)

# %% exercise="9.4"
class PrefixAware:
    """Route to the replica holding the most of the prompt, among those within `slack` requests of the
    least loaded."""

    def __init__(self, slack: int = 4) -> None:
        """slack: how many more requests than the lightest replica a cache hit may cost (>= 0)."""
        ### BEGIN SOLUTION
        self.slack = slack
        ### END SOLUTION

    def choose(self, replicas: Sequence[ReplicaView], prompt_tokens: int) -> int:
        """-> the index (an int) in `replicas` of the replica the rules above choose: never a replica that
        is not alive; only among those within `slack` of the lightest alive load (at slack exactly counts);
        the best hit among those, ties to the lower load, then the lower index. replicas is not changed.
        Raises RuntimeError when none is alive.
        """
        ### BEGIN SOLUTION
        alive = [i for i, r in enumerate(replicas) if r.alive]
        if not alive:
            raise RuntimeError("no replica is alive")
        lightest = min(replicas[i].load for i in alive)
        candidates = [i for i in alive if replicas[i].load <= lightest + self.slack]
        return max(candidates, key=lambda i: (replicas[i].cached_tokens, -replicas[i].load, -i))
        ### END SOLUTION


# %%
views = [ReplicaView(load=9, cached_tokens=2000), ReplicaView(load=3, cached_tokens=1500),
         ReplicaView(load=2, cached_tokens=0), ReplicaView(load=0, cached_tokens=4000, alive=False)]
print("slack 4 picks", PrefixAware(4).choose(views, 2100), "- slack 0 picks", PrefixAware(0).choose(views, 2100),
      "- slack 100 picks", PrefixAware(100).choose(views, 2100))

# %% [markdown]
# <details><summary>Hint 1: a nudge</summary>
#
# Work on indices, not on the views: the answer is an index, and ties go to the lower one.
# </details>
# <details><summary>Hint 2: the idea</summary>
#
# Filter twice (alive, then within the slack of the lightest alive load), then take the best by a key that
# ranks more cache first, then less load, then a lower index.
# </details>
# <details><summary>Hint 3: last resort</summary>
#
# A tuple key (cached tokens, minus load, minus index) and the maximum over the candidates.
# </details>

# %%
check("9.4")

# %% [markdown]
# ## Routing agent sessions at fleet scale (~5 min)
#
# Your policy in the simulator, against round robin and least-loaded: agent sessions of 16 tenants
# (each with its own 500-2000 token system prompt), 1-50 calls each, bursty arrivals, on 16 and
# then 64 replicas of Llama-3.1-8B on H100s (the roofline profile, on paper).

# %%
routers = {"round_robin": "round_robin", "least_loaded": "least_loaded", "yours": PrefixAware}  # a name, or your class

routing_rows = []
for replicas, sessions in ((16, 60), (64, 200)) if QUICK else ((16, 120), (64, 400)):
    for name, router in routers.items():
        router = router(slack=4) if name == "yours" else router  # a fresh policy object for each run
        result = simulate([], fleet_profile, replicas=replicas, router=router,
                          sessions=agent_sessions(sessions, rate=sessions / 60, seed=0), kv_blocks=20_000)
        s = summary(result.requests, {"ttft": 1.0, "tpot": 0.05})
        routing_rows.append(dict(replicas=replicas, router=name, hits=s["prefix_hit_rate"], ttft_p99=s["ttft_p99"],
                                 attainment=s["slo_attainment"]))
        print(f"{replicas:3d} replicas, {name:>12}: prefix hits {s['prefix_hit_rate']:6.1%}, TTFT p50 "
              f"{s['ttft_median'] * 1e3:5.0f} ms, p99 {s['ttft_p99'] * 1e3:6.0f} ms, SLO met {s['slo_attainment']:.1%}")
fig = go.Figure([go.Bar(name=f"{n} replicas", x=[r["router"] for r in routing_rows if r["replicas"] == n],
                        y=[r["hits"] for r in routing_rows if r["replicas"] == n]) for n in (16, 64)])
fig.update_layout(title="Prefix-cache hit rate of agent sessions by routing policy (simulated)",
                  yaxis_tickformat=".0%", height=320)
fig.show()

# %% [markdown]
# Before reading the bars, the theory: with blind routing, a session's next call lands on the
# replica holding its history about one time in N, so its hit rate should fall as N grows; a
# cache-aware policy should keep it whatever N is. Do the printed hit rates at 16 and 64 replicas
# bear that out?
#
# ## Exercise 9.5 · An autoscaling rule (~12 min)
#
# Traffic comes in waves; a replica costs money every second it runs, and a new one serves only
# after a **startup** delay (loading tens of GB of weights, warming up): tens of seconds or more. The
# simulator's `Autoscaler` (`minillm/sim/autoscale.py`) reads the fleet every `interval` seconds as a
# `FleetState(now, replicas, starting, waiting, running)` and asks a rule how many replicas it
# wants (it clamps the answer to `min_replicas … max_replicas`, starts replicas, or drains the
# newest ones).
#
# The obvious rule, "enough replicas for the queue right now" (`queue_rule`), **flaps**: it scales
# down the moment the queue shrinks, and when the next wave comes the replicas it needs are 20 s
# away. Yours follows the queue up at once, and comes down slowly. The rules it keeps:
#
# * **the need**: enough replicas for every request waiting or running at `per_replica` requests
#   each, never a fraction of a replica short;
# * **up at once**: when the need is at least what the fleet has or will soon have (replicas serving
#   plus those starting: they are on their way, do not ask for them twice), ask for the need;
# * **never down while growing**: while replicas are still starting, keep what is on its way;
# * **down slowly**: only when the need fits in a `keep` share of the serving replicas, and then by
#   one step to that share of them (rounded down, never below one replica); otherwise stay.
#
# A worked example on other numbers (per_replica 10, keep 0.5): 8 serving, none starting, 35 requests:
# the need is 4, which fits in half of 8, so the rule asks for 4; with 45 requests the need is 5: stay at 8.

# %% exercise="9.5"
def autoscale_rule(state: FleetState, per_replica: float = 16.0, keep: float = 0.7) -> int:
    """The replicas wanted (an int >= 1 whenever the fleet has a replica), given the fleet now, by the
    rules above (the Autoscaler calls it every interval and clamps the answer). per_replica > 0 requests a
    replica; 0 < keep < 1. state is not changed.
    """
    ### BEGIN SOLUTION
    want = math.ceil((state.waiting + state.running) / per_replica)
    have = state.replicas + state.starting
    if want >= have:
        return want
    if state.starting:
        return have
    if want <= keep * state.replicas:
        return max(1, math.floor(keep * state.replicas))
    return state.replicas
    ### END SOLUTION


# %%
for state in (FleetState(0, replicas=2, starting=0, waiting=40, running=20),
              FleetState(5, replicas=2, starting=2, waiting=10, running=30),
              FleetState(60, replicas=10, starting=0, waiting=0, running=50),
              FleetState(65, replicas=10, starting=0, waiting=0, running=120)):
    print(state, "->", autoscale_rule(state))

# %% [markdown]
# <details><summary>Hint 1: a nudge</summary>
#
# Compute two numbers first: the need, and what the fleet has or will have. Then the rules, in the order above.
# </details>
# <details><summary>Hint 2: the idea</summary>
#
# Round the need up. Compare the need with the share `keep` of the serving replicas, not with whole replicas.
# </details>
# <details><summary>Hint 3: last resort</summary>
#
# need = ceil((waiting + running) / per_replica); the shrunk fleet is max(1, floor(keep · replicas)).
# </details>

# %%
check("9.5")

# %% [markdown]
# Your rule in the simulator against the queue rule and a fixed fleet, on traffic that swings
# between 1 and 12 requests per second every 30 s (Llama-3.1-8B on H100s, the roofline profile, startup 20 s, SLO:
# TTFT ≤ 1 s and TPOT ≤ 50 ms). The cost is **replica-seconds**: every replica held, serving,
# starting or draining, times the seconds it was held.

# %%
def waves(seed: int = 0, period: float = 60.0, low: float = 1.0, high: float = 12.0,
          total: float = 240.0) -> list[SimRequest]:
    """Poisson arrivals whose rate alternates between low and high every period / 2 seconds."""
    gen = torch.Generator().manual_seed(seed)
    t, out = 0.0, []
    while t < total:
        t += torch.empty(1).exponential_(high if (t // (period / 2)) % 2 else low, generator=gen).item()
        out.append(SimRequest(t, int(torch.randint(200, 1500, (1,), generator=gen)),
                              int(torch.randint(50, 400, (1,), generator=gen)), request_id=f"r{len(out)}"))
    return out


scaling = {}
for name, rule in (("queue rule", queue_rule(16)), ("your rule", autoscale_rule), ("fixed 6", fixed_rule(6))):
    scaler = Autoscaler(rule, interval=5, startup_seconds=20, max_replicas=32)
    result = simulate(waves(), fleet_profile, replicas=2, router="least_loaded", autoscaler=scaler, kv_blocks=20_000,
                      max_num_seqs=32, sample_every=5)
    s = summary(result.requests, {"ttft": 1.0, "tpot": 0.05})
    scaling[name] = result
    print(f"{name:>10}: SLO met by {s['slo_attainment']:6.1%} of requests, {result.replica_seconds:5.0f} "
          f"replica-seconds, TTFT p99 {s['ttft_p99']:.2f} s")
fig = go.Figure([go.Scatter(x=[p["time"] for p in r.samples], y=[sum(p["alive"]) for p in r.samples], name=name,
                            mode="lines", line_shape="hv") for name, r in scaling.items()])
fig.update_layout(title="Serving replicas over time", xaxis_title="simulated seconds", yaxis_title="replicas",
                  height=320)
fig.show()

# %% [markdown]
# Read the three lines together: which rule is cheapest, and which meets the SLO most often? A
# rule that shrinks the moment a wave ends finds itself short when the next one comes, and the
# replicas it then asks for arrive 20 s late; a fleet fixed at the peak's size pays for its quiet
# periods. Autoscaling pays when the quiet periods are long compared with the startup delay
# (nights, weekends). Try `period=600` in `waves`, or `startup_seconds=120`, and see whether the
# ranking changes.

# %% [markdown]
# ## Your engine, calibrated: one replica predicted, then measured (~20 min)
#
# Every simulation so far priced its steps with a roofline of an H100 that nobody here measured.
# A capacity plan deserves better: the step costs of **your** engine on **your** machine. The
# simulator's `StepProfile` (`minillm/sim/step_profile.py`) prices a step from what it holds: a
# fixed part, the tokens it computes (prefill and decode tokens alike, along a measured curve), and
# the context its decodes read. `measure_profile` (`minillm/sim/calibrate.py`, also `python -m
# minillm bench profile`) replays a calibration workload through the real engine (bursts, a trickle,
# lone prompts), records every step and fits those prices to them. Below it runs on
# SmolLM2-135M-Instruct here (about half a minute under the test suite, longer for your run).

# %%
import dataclasses
import statistics
import time

from minillm import EngineConfig
from minillm.config import QuantConfig
from minillm.engine.engine import LLMEngine
from minillm.labkit import REAL_MODEL, compare, real_model_installed
from minillm.sim.calibrate import alone_seconds, measure_profile, replay, replica_knobs, workload
from minillm.sim.plan import predict

HAVE_REAL = real_model_installed()
MODEL_HERE = REAL_MODEL if HAVE_REAL else "tiny"  # without SmolLM2 installed, the bundled tiny model stands in
engine = LLMEngine(EngineConfig.from_knobs(MODEL_HERE, max_num_seqs=8, enable_prefix_caching=False))
started = time.perf_counter()
mine = measure_profile(engine, requests=8 if QUICK else 48)
print(f"calibrated in {time.perf_counter() - started:.0f} s: {mine.describe()}")
print(f"steps stay slow or fast together: persistence {mine.persistence:.2f} (0: each step independent)")

# %% [markdown]
# **Predict.** The workload below is a stream of short chat requests (prompts of `PROMPT` tokens,
# outputs of `OUTPUT` tokens, uniform in those ranges) arriving at `RATE` per second, about twice what
# this replica could serve one request at a time. From the profile's step costs printed above, work
# out the output tokens per second this replica sustains on it (hint: does the replica keep up, and
# if so what does it make per second; if not, what does a batched step of its sequences make?).

# %%
N_REQUESTS, PROMPT, OUTPUT = (6, (16, 64), (4, 12)) if QUICK else (24, (16, 128), (8, 32))
mean_prompt, mean_output = sum(PROMPT) / 2, sum(OUTPUT) / 2
one_at_a_time = mine.step_time(int(mean_prompt), 0, 0) + mean_output * mine.step_time(0, 1, int(mean_prompt))
RATE = 2.0 / one_at_a_time
print(f"{N_REQUESTS} requests at {RATE:.2f} per second; one mean request alone costs this replica "
      f"{one_at_a_time:.2f} s")

MY_PREDICTION = None  # output tokens/s of one replica on this workload: from the step costs above

# %%
work = workload(N_REQUESTS, RATE, seed=3, prompt=PROMPT, output=OUTPUT)
predicted = predict(work, mine, **replica_knobs(engine))  # the simulator: the median of 5 seeded runs
real = summary(replay(engine, work))                       # the same requests through the real engine, in real time
print(f"{'':>10} {'tokens/s':>9} {'TTFT p50':>9} {'TTFT p99':>9} {'TPOT p50':>9} {'TPOT p99':>9}")
for name, row in (("simulated", predicted), ("measured", real)):
    print(f"{name:>10} {row['output_throughput']:9.2f} {row['ttft_median'] * 1e3:7.0f}ms "
          f"{row['ttft_p99'] * 1e3:7.0f}ms "
          f"{row['tpot_median'] * 1e3:7.1f}ms {row['tpot_p99'] * 1e3:7.1f}ms")
compare(f"one replica of {MODEL_HERE} here, {N_REQUESTS} requests at {RATE:.2f}/s", MY_PREDICTION,
        theory=predicted["output_throughput"], measured=real["output_throughput"], unit="tokens/s",
        theory_name="simulator on your profile",
        gap="near 1: the profile prices your engine's steps; far from it on a shared CPU: the machine's pace drifted "
            "between the calibration and the run (rerun both). The latency columns test the profile harder")

# %% [markdown]
# A simulator that matches one replica is worth trusting a little for many. Read the two rows:
# which figure agrees best, and which worst? The throughput is set by the arrivals when the replica
# keeps up, so it agrees almost by construction; the latencies are the real test of the profile.
#
# ## Same weights, different performance (~20 min)
#
# One model, one machine, one workload: what you get still depends on how you serve it. Here the
# same SmolLM2 weights and the same requests, under three configurations of the engine:
#
# * **default**: up to 8 sequences in a batch (what you just measured);
# * **one sequence at a time**: `max_num_seqs=1`, no batching;
# * **int8 weights**: `quantization=QuantConfig("int8")` (lab 06), batching as the default.
#
# **Predict** both before you run them, from the step profile. For one sequence at a time, the
# simulator can tell you (the profile holds what a batched step costs against a step of one); work
# out first which way it moves, and by how much. For int8, the profile of the float32 weights cannot:
# the engine itself changed, so it gets a profile of its own below. Predict that profile's price of
# a decode step of one sequence: such a step reads every weight once (lab 00), and int8 weights are a
# quarter of float32's bytes.

# %%
MY_PREDICTIONS = {"one sequence at a time (tokens/s)": None,       # from the profile: batching's worth here
                  "int8: a decode step of one sequence (ms)": None}  # from the bytes that step reads

# %%
configs = {"default": engine,
           "one sequence at a time": LLMEngine(EngineConfig.from_knobs(MODEL_HERE, max_num_seqs=1,
                                                                       enable_prefix_caching=False)),
           "int8 weights": LLMEngine(EngineConfig.from_knobs(MODEL_HERE, max_num_seqs=8, enable_prefix_caching=False,
                                                             quantization=QuantConfig("int8")))}
int8_profile = measure_profile(configs["int8 weights"], requests=8 if QUICK else 48)
print(f"float32: {mine.describe()}\nint8:    {int8_profile.describe()}")
profiles = {"default": mine, "one sequence at a time": mine, "int8 weights": int8_profile}
same = {"default": (predicted, real)}
for name, eng in configs.items():
    if name not in same:
        same[name] = (predict(work, profiles[name], **replica_knobs(eng)), summary(replay(eng, work)))
print(f"{'':>24} {'tokens/s':>9} {'TTFT p50':>9} {'TPOT p50':>9}   simulated on its profile")
for name, (sim, got) in same.items():
    print(f"{name:>24} {got['output_throughput']:9.2f} {got['ttft_median'] * 1e3:7.0f}ms "
          f"{got['tpot_median'] * 1e3:7.1f}ms"
          f"   {sim['output_throughput']:6.2f} tokens/s, TTFT {sim['ttft_median'] * 1e3:5.0f} ms, "
          f"TPOT {sim['tpot_median'] * 1e3:5.1f} ms")
one_sim, one_real = same["one sequence at a time"]
compare("one sequence at a time: output tokens/s", MY_PREDICTIONS["one sequence at a time (tokens/s)"],
        theory=one_sim["output_throughput"], measured=one_real["output_throughput"], unit="tokens/s",
        theory_name="simulator on your profile",
        gap="the simulator knows what a step of one costs against a batched step: if it matches, batching's worth "
            "on this machine is in the profile; if not, compare with the default row, run at another moment")
context = int(mean_prompt + mean_output / 2)  # what a mean decode reads
compare("int8: a decode step of one sequence", MY_PREDICTIONS["int8: a decode step of one sequence (ms)"],
        theory=mine.step_time(0, 1, context) * 1e3 / 4, measured=int8_profile.step_time(0, 1, context) * 1e3,
        unit="ms", theory_name="float32's step, a quarter of the bytes",
        gap="above 1: a step is not only weight bytes (the fixed work of a step, dequantizing, the sampler); near 1: "
            "this machine's decode step was bandwidth-bound, as lab 00's roofline says")
fig = go.Figure([go.Bar(name=stat, x=list(same), y=[got[key] * 1e3 for _, got in same.values()])
                 for stat, key in (("TTFT p50", "ttft_median"), ("TPOT p50", "tpot_median"))])
fig.update_layout(title=f"The same {MODEL_HERE} weights, three configurations, measured here", yaxis_title="ms",
                  barmode="group", height=340)
fig.show()

# %% [markdown]
# Explain the three rows from the step profile before you read on. Where does the default's
# advantage over one sequence at a time come from: the profile's price of a step of one token
# against a step of a few (`describe()` above)? Which of TTFT and TPOT does batching cost, and
# which does it buy? And int8: it changed the engine, so it needed a profile of its own. Compare the
# two profiles' lines: which price moved (the step of one token, the extra per token, the prefill
# tokens), and does that explain the int8 row's TTFT and TPOT? (On a busy shared CPU, rerun the cell
# before you trust a difference of a few percent.)
#
# ## Tails come from variance (~10 min)
#
# A simulator is only as good as its step costs. A measured profile holds a price per step, and also
# how far real steps strayed from that price: the calibration above printed the spread of your
# machine's steps (the share of steps within a band of their price) and their persistence. If the
# mean is right, does the spread matter? Queueing theory says it does. In an M/G/1 queue (Poisson
# arrivals, one server, any service time S) the mean wait is λ·E[S²] / (2(1 − ρ)), the
# Pollaczek-Khinchine formula: it grows with the service time's second moment, so steps that vary
# make requests wait longer than constant steps of the same mean, and the tail (p99) most of all.
#
# The formula assumes each service time is drawn independently. Real steps are not: a slow step is
# often followed by slow ones (the core stays busy elsewhere for a while). A measured profile keeps
# that too, as its `persistence`: each step's pace keeps that share of the last one's (an AR(1)
# process, see `minillm/sim/pace.py`), while every step alone still follows the spread.
#
# Below, one replica with your profile serves a longer Poisson workload in the simulator, three
# ways (`predict` takes the median of 5 seeded runs): as measured, with the spread and its
# persistence; with the spread drawn afresh each step; and every step costing its price times the
# spread's mean (a measured profile keeps the long steps' spread apart, as they stray less): the
# same mean, no variance.

# %%
long_work = workload(100 if QUICK else 300, 1.5 / alone_seconds(mine), seed=3)  # 1.5x one at a time's rate
tails = {}
constant = dataclasses.replace(  # each step its spread's mean cost relative to its price (long steps their own)
    mine, spread=(statistics.fmean(mine.spread),) if mine.spread else (),
    long_spread=(statistics.fmean(mine.long_spread),) if mine.long_spread else ())
for name, profile in (("as measured", mine),
                      ("spread drawn afresh", dataclasses.replace(mine, persistence=0.0)),
                      ("every step its mean cost", constant)):
    tails[name] = predict(long_work, profile, **replica_knobs(engine))
    t = tails[name]
    print(f"{name:>28}: TTFT p50 {t['ttft_median']:6.2f} s, p99 {t['ttft_p99']:6.2f} s; "
          f"TPOT p50 {t['tpot_median'] * 1e3:5.1f} ms, p99 {t['tpot_p99'] * 1e3:5.1f} ms")
fig = go.Figure([go.Bar(name=name, x=["TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99"],
                        y=[t[k] * 1e3 for k in ("ttft_median", "ttft_p99", "tpot_median", "tpot_p99")])
                 for name, t in tails.items()])
fig.update_layout(title=f"One replica of {MODEL_HERE} here (simulated): the same mean step, three ways to vary it",
                  yaxis_title="ms", height=340)
fig.show()

# %% [markdown]
# Compare the medians with the p99s across the three rows. Which moves more when the variance goes?
# Persistence should matter most to TPOT p99: a request's TPOT averages its own steps, which
# independent draws even out and slow spells do not. (With a persistence near 0 in your profile, the
# first two rows agree: your machine's slow steps came alone.) A capacity plan priced with constant
# steps promises the tails the last row shows; check which one your real run above came closest to.

# %% [markdown]
# ## Exercise 9.6 · What tensor parallelism costs on the link (~6 min)
#
# Count the all-reduces of one forward pass with Megatron's recipe: in each Llama layer, one after
# the attention's row-parallel output projection and one after the MLP's `down`. Each reduces a
# `[tokens, H]` activation. The usual algorithm, **ring all-reduce**, is a reduce-scatter then an
# all-gather: in each half, every rank sends `world − 1` pieces of `1/world` of the tensor (NCCL's
# tests call the resulting per-rank traffic over the tensor's size the "bus bandwidth" factor).
# Worked on other numbers: a 1 MB tensor over 5 ranks: each half sends 4 pieces of 0.2 MB, so 1.6 MB
# per rank for the all-reduce. One rank (world = 1) sends nothing.

# %% exercise="9.6"
def allreduce_bytes_per_token(hidden_size: int, num_layers: int, world: int, dtype_bytes: int = 2) -> float:
    """Bytes (a float) each rank sends per token in a tensor-parallel forward pass of a Llama model with
    ring all-reduces, as described above; 0.0 for world 1. hidden_size, num_layers, dtype_bytes: ints >= 1.
    Raises ValueError when world < 1 (say the value).
    """
    ### BEGIN SOLUTION
    if world < 1:
        raise ValueError(f"world must be >= 1, got {world}")
    return num_layers * 2 * 2 * (world - 1) / world * hidden_size * dtype_bytes
    ### END SOLUTION


# %%
for world in (1, 2, 4, 8):
    per_token = allreduce_bytes_per_token(llama8b.hidden_size, llama8b.num_hidden_layers, world)
    print(f"Llama-3.1-8B at TP={world}: {per_token / 1e6:.2f} MB per token per rank; a prefill of 4096 tokens "
          f"moves {per_token * 4096 / 1e9:.2f} GB per rank: {per_token * 4096 / 450e9 * 1e3:.1f} ms over "
          f"NVLink (450 GB/s each way), {per_token * 4096 / 25e9 * 1e3:.0f} ms over 200 Gb/s Ethernet")

# %% [markdown]
# <details><summary>Hint 1: a nudge</summary>
#
# Three factors: how many all-reduces per token, how many bytes each reduces, and what the ring multiplies
# those bytes by for each rank.
# </details>
# <details><summary>Hint 2: the idea</summary>
#
# Two per layer; H values of dtype_bytes each per token; the ring's factor from the worked example, with
# world ranks instead of 5.
# </details>
# <details><summary>Hint 3: last resort</summary>
#
# layers · 2 · 2(world − 1)/world · H · dtype_bytes.
# </details>

# %%
check("9.6")

# %% [markdown]
# (The link rates are vendors' figures: NVIDIA's H100 SXM datasheet gives NVLink 900 GB/s, both
# directions together; a 200 Gb/s Ethernet port carries 25 GB/s.) Those figures are why tensor
# parallelism stays inside one machine (NVLink), and across machines
# one uses pipeline parallelism or more replicas instead: the per-token traffic does not shrink as
# the ranks grow, while the compute per rank does.

# %% [markdown]
# ## A capacity plan, on paper, from your profile (~10 min)
#
# How many replicas of **your** engine does a product need? Say chat requests like those above
# arrive at 20 times the rate one replica sustained, and every request must meet a TTFT and a TPOT
# SLO for 99% of them. The SLO is stated in your machine's own step costs (a TTFT of a few mean
# prefills, a TPOT of twice a decode step), so that it means the same on a fast and a slow CPU.
# `replicas_needed` (`minillm/sim/plan.py`) simulates the traffic on 1, 2, 4, … replicas, then
# bisects to the fewest that meet the SLO. With TP=2 a replica is two machines whose steps are (at
# best) twice as fast, and your 9.6 says what they pay on the link. This is paper: the profile is
# measured, the fleet is not; a plan is checked against a real run of one or two replicas (you did
# one above) before it is trusted.

# %%
slo = {"ttft": 4 * mine.step_time(int(mean_prompt), 0, 0), "tpot": 2 * mine.step_time(0, 1, int(mean_prompt))}
traffic = 20 * RATE
plan = {}
halved = dataclasses.replace(mine, fixed=mine.fixed / 2, per_prefill_token=mine.per_prefill_token / 2,
                             per_decode_seq=mine.per_decode_seq / 2, per_context_token=mine.per_context_token / 2,
                             token_curve=tuple((n, t / 2) for n, t in mine.token_curve), source="TP=2, an ideal 2x")
print(f"traffic {traffic:.1f} requests/s; SLO: TTFT <= {slo['ttft']:.2f} s, TPOT <= {slo['tpot'] * 1e3:.0f} ms")
for name, profile, machines_per_replica in (("TP=1", mine, 1), ("TP=2", halved, 2)):
    needed, s = replicas_needed(lambda: (workload(200 if QUICK else 600, traffic, seed=1, prompt=PROMPT,
                                                  output=OUTPUT), []), profile, slo, **replica_knobs(engine))
    plan[name] = needed * machines_per_replica
    print(f"{name}: {needed} replicas = {needed * machines_per_replica} machines like this one (SLO met by "
          f"{s['slo_attainment']:.1%} of requests, TTFT p99 {s['ttft_p99']:.2f} s)")
shape = engine.model_config
link = allreduce_bytes_per_token(shape.hidden_size, shape.num_hidden_layers, 2, dtype_bytes=engine.dtype.itemsize)
print(f"TP=2 of {MODEL_HERE} ({shape.num_hidden_layers} layers of {shape.hidden_size}, {engine.dtype}) moves "
      f"{link / 1e3:.0f} kB per token per rank, which the ideal TP=2 profile ignores")

# %% [markdown]
# Read the plan critically: the profile was measured on one machine at one moment (a shared CPU's
# steps drift), the workload is a model of chat traffic, not yours, and the TP=2 profile assumes a
# perfect 2x with a free link. What the plan is good for is the *shape*: which SLO binds, how the
# answer moves with the traffic, and where a measurement would change it most.

# %% [markdown]
# ## Your parts inside the real pieces (~5 min)
#
# `check("9.E")` (also part of `make grade LAB=09`) plugs your parts in where they belong
# (`minillm.labkit.plug.lab_parts`):
#
# * your `shard_columns` / `shard_rows` build the MLP shards of two ranks talking over
#   `torch.distributed` (gloo, two processes), with your `tp_mlp_forward`'s placement of the
#   all-reduce: the output equals the unsharded MLP of the bundled model's first layer;
# * your `pack_kv` / `unpack_kv` move a prompt's K/V from one real engine's pool into another's;
# * your `PrefixAware` routes in the simulator and in the real router's replica picker as the
#   engine's policy does, and reaches its hit rate on a multi-tenant workload;
# * your `autoscale_rule` runs the simulator's autoscaler to the reference's SLO and cost.

# %%
check("9.E")

# %% [markdown]
# ## How production engines do it (~3 min)
#
# * **vLLM** shards models with Megatron-style `ColumnParallelLinear` / `RowParallelLinear` layers
#   (`--tensor-parallel-size`), and fuses gate and up into a `MergedColumnParallelLinear` that
#   shards each half separately, as in 9.2; it all-reduces with NCCL (or a custom all-reduce kernel
#   for small tensors inside one NVLink machine).
# * **SGLang** uses the same layer scheme; its **router** (`sglang-router`) routes by cache
#   affinity, keeping an approximate radix tree of what each worker holds, and falls back to the
#   shortest queue when the load is imbalanced past a threshold: 9.4's rule with a different
#   balance test.
# * **DistServe** (Zhong et al. 2024) places prefill and decode on different GPUs to meet TTFT and
#   TPOT SLOs at once; **Mooncake** (Moonshot AI's serving platform for Kimi) disaggregates too,
#   with a KV-cache store spread over the cluster's CPU memory and SSDs, moved over RDMA. vLLM
#   has experimental disaggregated prefill with KV connectors (e.g. NIXL, LMCache).
# * **Autoscaling** in Kubernetes (the Horizontal Pod Autoscaler) has a scale-down stabilization
#   window (5 minutes by default) for exactly the flapping 9.5 avoids; KServe and the
#   Kubernetes Gateway API inference extension scale and route LLM servers on queue length and
#   KV-cache use.
