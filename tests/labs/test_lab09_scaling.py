"""Grader of lab 09, scaling out.

Oracles: torch.tensor_split (shards), the unsharded SwiGLU MLP and the real model's layers, the
engine's communication formulas (minillm/tp/comm.py), the pool's own slots read one by one, and
the engine's reference parts (minillm/router/policies.py's PrefixAware, the spec of the autoscaling rule
written out here). For 9.E the learner's parts run inside the real pieces: a tensor-parallel shard of
the bundled model (minillm/tp/tp_model.py) on two ranks in threads, two engines' KV pools, the
cluster simulator and the router's replica picker.
"""
import contextlib
import functools
import math
import random
import threading
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

import minillm.tp.parallel_linear as parallel_linear
from minillm import LLM, SamplingParams
from minillm.labkit import exercise
from minillm.labkit.fixtures import assert_close, one_thread, randn
from minillm.labkit.plug import lab_parts
from minillm.perf import PROFILES, model_shape
from minillm.router.policies import PrefixAware, ReplicaView
from minillm.router.replica_state import RouterState
from minillm.sim import SimRequest, StepProfile, simulate
from minillm.sim.autoscale import Autoscaler, FleetState
from minillm.sim.plan import summary
from minillm.sim.workloads import agent_sessions
from minillm.tp.comm import allreduce_bytes_per_token, ring_bytes_per_rank
from minillm.tp.tp_model import shard_model

EXERCISES = {"9.1": "shard_columns, shard_rows", "9.2": "tp_mlp_forward", "9.3": "pack_kv, unpack_kv",
             "9.4": "PrefixAware", "9.5": "autoscale_rule", "9.6": "allreduce_bytes_per_token",
             "9.E": "your parts in the real pieces"}




# -- 9.1 shard_columns, shard_rows -----------------------------------------------------------------------
SHARDS = (("shard_columns", 0), ("shard_rows", 1))  # (the function, the dimension of the weight it splits)


def random_weight(rng: random.Random, seed: int) -> torch.Tensor:
    """A seeded weight of both signs, [out, in] of products of 2, 3 and 5 (several worlds divide them),
    stored row-major, or as the transpose of a row-major [in, out] (column-major: not contiguous)."""
    out, inp = (rng.choice([2, 3, 4, 5, 6]) * rng.choice([1, 2, 4, 6]) for _ in range(2))
    return randn(seed, out, inp) if rng.random() < 0.5 else randn(seed, inp, out).T


@exercise("9.1")
def test_shards_are_torch_splits_on_random_weights(lab):
    """on seeded weights of both signs (non-square, row- or column-major, every world from 1 to 8 that divides
    them), rank r's column shard is the r-th of torch.tensor_split(weight, world, dim=0) and its row shard the
    r-th along dim 1, contiguous"""
    rng = random.Random(901)
    with one_thread():
        for seed in range(12):
            w = random_weight(rng, 900 + seed)
            for name, dim in SHARDS:
                for world in (n for n in range(1, 9) if w.shape[dim] % n == 0):
                    for rank in range(world):
                        got = getattr(lab, name)(w, rank, world)
                        what = f"{name} of a {'x'.join(map(str, w.shape))} weight, rank {rank} of {world}"
                        assert_close(got, torch.tensor_split(w, world, dim=dim)[rank], what, atol=0, rtol=0)
                        assert got.is_contiguous(), f"{what}: a non-contiguous shard (a rank keeps a contiguous copy)"


@exercise("9.1")
def test_shards_are_copies_in_the_weights_dtype(lab):
    """shards of seeded float32, bfloat16 and int8 weights (world 1 too: the whole weight) keep the weight's dtype
    and share no memory with it: writing to the weight afterwards leaves every shard as it was, and writing to a
    shard leaves the weight"""
    rng = random.Random(911)
    with one_thread():
        for seed, dtype in enumerate((torch.float32, torch.bfloat16, torch.int8, torch.float32)):
            w = (random_weight(rng, 910 + seed) * 20).to(dtype)
            before = w.clone()
            for name, dim in SHARDS:
                for world in (1, *(n for n in (2, 3, 4) if w.shape[dim] % n == 0)):
                    rank = rng.randrange(world)
                    what = f"{name} of a {'x'.join(map(str, w.shape))} {dtype} weight, rank {rank} of {world}"
                    got = getattr(lab, name)(w, rank, world)
                    want = torch.tensor_split(before, world, dim=dim)[rank]
                    assert isinstance(got, torch.Tensor) and got.dtype == dtype, \
                        f"{what}: the shard is {getattr(got, 'dtype', type(got).__name__)}, the weight {dtype}"
                    assert got.untyped_storage().data_ptr() != w.untyped_storage().data_ptr(), \
                        f"{what}: the shard is a view of the weight's memory, not a copy"
                    w.add_(1)
                    assert torch.equal(got, want), f"{what}: the shard changed when the weight was written to"
                    got.sub_(3)
                    assert torch.equal(w, before + 1), f"{what}: writing to the shard changed the weight"
                    w.copy_(before)


@exercise("9.1")
def test_shards_fixed_cases_and_refusals(lab):
    """arange(24) as 4x6: column shard 1 of 2 is rows 2-3, row shard 1 of 3 is columns 2-3; the shards put
    back together give the weight; world not dividing (the other dimension divided), world 0 or negative (even
    dividing the size), and a rank out of range raise ValueError"""
    w = torch.arange(24.0).reshape(4, 6)
    assert torch.equal(lab.shard_columns(w, 1, 2), w[2:4]), "column shard 1 of 2 must be rows 2 and 3 of W"
    assert torch.equal(lab.shard_rows(w, 1, 3), w[:, 2:4]), "row shard 1 of 3 must be columns 2 and 3 of W"
    assert torch.equal(torch.cat([lab.shard_columns(w, r, 4) for r in range(4)]), w), "column shards do not tile W"
    assert torch.equal(torch.cat([lab.shard_rows(w, r, 6) for r in range(6)], dim=1), w), "row shards do not tile W"
    refused = [("shard_columns", 0, 3), ("shard_rows", 0, 4), ("shard_columns", 2, 2), ("shard_rows", -1, 2),
               ("shard_columns", 4, 4), ("shard_rows", 6, 6)]
    refused += [(name, rank, world) for name in ("shard_columns", "shard_rows") for rank, world in
                ((0, 0), (0, -1), (0, -2), (-1, -2), (1, -2))]
    for name, rank, world in refused:
        with pytest.raises(ValueError):
            got = getattr(lab, name)(w, rank, world)
            raise AssertionError(f"{name}(a 4x6 weight, rank={rank}, world={world}) returned {got!r}; expected a "
                                 f"ValueError")


# -- 9.2 tp_mlp_forward -----------------------------------------------------------------------------------
class RecordingAllReduce:
    """The simulated all-reduce, remembering what it was given."""

    def __init__(self) -> None:
        self.calls: list[list[torch.Tensor]] = []

    def __call__(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        self.calls.append([t.detach().clone() for t in tensors])
        total = torch.stack(tensors).sum(0)
        return [total.clone() for _ in tensors]


def mlp(x, gate_up, down):
    gate, up = (x @ gate_up.T).chunk(2, dim=-1)
    return (F.silu(gate) * up) @ down.T


def check_tp_mlp(lab, x, gate_up, down, world, what):
    reduce = RecordingAllReduce()
    got = lab.tp_mlp_forward(x, gate_up, down, world, reduce)
    assert_close(got, mlp(x, gate_up, down), f"{what}: the tensor-parallel MLP against the unsharded one", atol=1e-4)
    assert len(reduce.calls) == 1, f"{what}: all_reduce called {len(reduce.calls)} times; the MLP needs exactly one"
    partials = reduce.calls[0]
    assert len(partials) == world, f"{what}: all_reduce got {len(partials)} tensors, one per rank expected ({world})"
    gate, up = gate_up.chunk(2)
    for r, partial in enumerate(partials):  # rank r's partial sum: its slice of the activation through its down rows
        cols = torch.tensor_split(torch.arange(down.shape[1]), world)[r]
        want = (F.silu(x @ gate[cols].T) * (x @ up[cols].T)) @ down[:, cols].T
        assert_close(partial, want, f"{what}: rank {r}'s tensor given to all_reduce (its partial of down)", atol=1e-4)


@exercise("9.2")
def test_tp_mlp_equals_the_unsharded_mlp_with_one_all_reduce(lab):
    """seeded MLPs (hidden 16 to 48, width 24 to 96, 1 to 7 tokens), world 1, 2, 3, 4 and 6: the output equals
    the unsharded SwiGLU MLP, all_reduce runs once, on each rank's partial [tokens, hidden] of down"""
    with one_thread():
        for seed, (tokens, hidden, width) in enumerate(((1, 16, 24), (5, 32, 48), (7, 48, 96))):
            x, gate_up, down = randn(920 + seed, tokens, hidden), randn(930 + seed, 2 * width, hidden, scale=0.5), \
                randn(940 + seed, hidden, width, scale=0.5)
            for world in (1, 2, 3, 4, 6):
                check_tp_mlp(lab, x, gate_up, down, world, f"{tokens} tokens, hidden {hidden}, width {width}, "
                                                           f"world {world}")


@exercise("9.2")
def test_tp_mlp_on_the_bundled_models_layer(lab):
    """the MLP of tiny's first layer (hidden 256, width 768) on 3 tokens, world 2, 3 and 4, equals the model's
    own mlp(x), with one all-reduce of the down partials"""
    model = bundled_model()
    layer = model.model.layers[0].mlp
    x = randn(950, 3, model.config.hidden_size)
    with torch.no_grad(), one_thread():
        want = layer(x)
        gate_up, down = layer.gate_up_proj.weight.detach(), layer.down_proj.weight.detach()
        assert_close(mlp(x, gate_up, down), want, "the grader's MLP formula against tiny's layer", atol=1e-5)
        for world in (2, 3, 4):
            check_tp_mlp(lab, x, gate_up, down, world, f"tiny's layer 0 MLP, world {world}")


@functools.cache
def bundled_model():
    with one_thread():
        return LLM("tiny").engine.model


# -- 9.3 pack_kv, unpack_kv -------------------------------------------------------------------------------
POOL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def slots(k_blocks, table, num_tokens):
    """The reference: token t read alone from slot t % block_size of block table[t // block_size]."""
    bs = k_blocks.shape[2]
    return torch.stack([k_blocks[:, table[t // bs], t % bs] for t in range(num_tokens)], dim=1)


@exercise("9.3")
def test_pack_gathers_exactly_the_filled_slots(lab):
    """seeded pools (1-3 layers, block sizes 1, 4, 5, 16; float32, bfloat16, float16), scattered block tables
    (lists or tuples), 1 to 40 tokens (the last block full or partial): the buffer is [2, layers, tokens, heads,
    dim] in the pool's dtype, contiguous, with each token read from its slot"""
    rng = random.Random(903)
    with one_thread():
        for case in range(30):
            layers, bs, heads, dim = rng.randint(1, 3), rng.choice([1, 4, 5, 16]), rng.randint(1, 3), rng.randint(1, 4)
            num_tokens = bs * rng.randint(1, 3) if case % 4 == 0 else rng.randint(1, 40)
            need = -(-num_tokens // bs)
            blocks = need + rng.randint(0, 5)
            dtype = POOL_DTYPES[case % 3]
            k = randn(case, layers, blocks, bs, heads, dim).to(dtype)
            v = randn(case + 100, layers, blocks, bs, heads, dim).to(dtype)
            table = rng.sample(range(blocks), need)
            table = tuple(table) if case % 2 else table
            got = lab.pack_kv(k, v, table, num_tokens)
            want = torch.stack([slots(k, table, num_tokens), slots(v, table, num_tokens)])
            what = f"case {case}: pack_kv of {num_tokens} tokens in blocks {table} of size {bs} ({dtype})"
            assert_close(got, want, what, atol=0, rtol=0)
            assert got.dtype == dtype, f"{what}: the buffer is {got.dtype}, the pool {dtype}"
            assert got.is_contiguous(), f"{what}: the packed buffer must be contiguous (it goes on the wire)"


@exercise("9.3")
def test_unpack_writes_the_filled_slots_and_nothing_else(lab):
    """seeded buffers (float32, bfloat16, float16) unpacked into other blocks (lists or tuples) of a pool filled
    with sentinels: each token lands in its slot, every other slot (the last block's tail, other blocks) keeps its
    value; pack(unpack(b)) == b"""
    rng = random.Random(913)
    with one_thread():
        for case in range(30):
            check_unpack(lab, rng, case)


def check_unpack(lab, rng: random.Random, case: int) -> None:
    """One seeded case: a buffer unpacked into a pool of sentinels, checked slot by slot."""
    layers, bs, heads, dim = rng.randint(1, 3), rng.choice([1, 4, 5, 16]), rng.randint(1, 3), rng.randint(1, 4)
    num_tokens = bs * rng.randint(1, 3) if case % 4 == 0 else rng.randint(1, 40)
    need = -(-num_tokens // bs)
    blocks = need + rng.randint(0, 5)
    dtype = POOL_DTYPES[case % 3]
    buffer = randn(case + 200, 2, layers, num_tokens, heads, dim).to(dtype)
    k = torch.full((layers, blocks, bs, heads, dim), 7.0, dtype=dtype)
    v = torch.full((layers, blocks, bs, heads, dim), -7.0, dtype=dtype)
    table = rng.sample(range(blocks), need)
    table = tuple(table) if case % 2 else table
    lab.unpack_kv(buffer, k, v, table)
    want_k, want_v = torch.full_like(k, 7.0), torch.full_like(v, -7.0)
    for t in range(num_tokens):
        want_k[:, table[t // bs], t % bs] = buffer[0, :, t]
        want_v[:, table[t // bs], t % bs] = buffer[1, :, t]
    assert_close(k, want_k, f"case {case}: the key pool after unpacking {num_tokens} tokens into {table} "
                            f"(blocks of {bs})", atol=0, rtol=0)
    assert_close(v, want_v, f"case {case}: the value pool after unpacking", atol=0, rtol=0)
    assert torch.equal(lab.pack_kv(k, v, table, num_tokens), buffer), f"case {case}: pack(unpack(b)) != b"


@exercise("9.3")
def test_kv_transfer_fixed_cases(lab):
    """10 tokens in blocks of 4 at [5, 2, 7]: 10 tokens packed, not 12; token 9 from block 7 slot 1;
    a block table of the wrong length raises ValueError in both"""
    k = torch.arange(8 * 4, dtype=torch.float32).reshape(1, 8, 4, 1, 1)
    buffer = lab.pack_kv(k, -k, [5, 2, 7], 10)
    assert tuple(buffer.shape) == (2, 1, 10, 1, 1), f"the buffer's shape is {tuple(buffer.shape)}, expected " \
                                                    f"(2, 1, 10, 1, 1): only the filled slots travel"
    assert buffer[0, 0, :, 0, 0].tolist() == [20, 21, 22, 23, 8, 9, 10, 11, 28, 29], buffer[0, 0, :, 0, 0].tolist()
    assert torch.equal(buffer[1], -buffer[0]), "buffer[1] must hold the values (V), buffer[0] the keys (K)"
    for bad in ([5, 2], [5, 2, 7, 1]):
        with pytest.raises(ValueError):
            lab.pack_kv(k, -k, bad, 10)
        with pytest.raises(ValueError):
            lab.unpack_kv(buffer, k.clone(), k.clone(), bad)


# -- 9.4 PrefixAware --------------------------------------------------------------------------------------
def random_views(rng: random.Random) -> list[ReplicaView]:
    n = rng.randint(1, 8)
    views = [ReplicaView(rng.randint(0, 12), rng.choice([0, 0, 16, 32, 48, 64, 128]), rng.random() > 0.2)
             for _ in range(n)]
    if not any(v.alive for v in views):
        views[rng.randrange(n)] = ReplicaView(views[0].load, views[0].cached_tokens, True)
    return views


@exercise("9.4")
def test_prefix_aware_matches_the_reference_on_random_fleets(lab):
    """2000 seeded fleets (1-8 replicas, some dead, loads 0-12, few distinct hit sizes so ties happen), slack
    0 to 6 and huge: the same choice as the engine's PrefixAware"""
    rng = random.Random(904)
    for case in range(2000):
        slack = rng.choice([0, 1, 2, 4, 6, 10**9])
        views = random_views(rng)
        got, want = lab.PrefixAware(slack).choose(views, 200), PrefixAware(slack).choose(views, 200)
        assert got == want, f"case {case}, slack {slack}, replicas {views}: you chose {got}, the reference {want}"


@exercise("9.4")
def test_prefix_aware_fixed_cases(lab):
    """a hit loses to a replica more than slack busier's lightest rival, wins within slack; a dead replica's
    hit is never taken; ties go to the lower load, then the lower index; two policies of different slacks keep
    their own; no replica alive raises"""
    views = [ReplicaView(9, 2000), ReplicaView(3, 1500), ReplicaView(2, 0), ReplicaView(0, 4000, alive=False)]
    strict, loose = lab.PrefixAware(0), lab.PrefixAware(100)
    assert (strict.choose(views, 2100), loose.choose(views, 2100), strict.choose(views, 2100)) == (2, 0, 2), \
        "PrefixAware(0) and PrefixAware(100) side by side: each must route with its own slack (2, then 0, then 2)"
    assert lab.PrefixAware(4).choose(views, 2100) == 1, "slack 4: replica 0 (load 9) is too busy, 1 (load 3) wins"
    assert lab.PrefixAware(0).choose(views, 2100) == 2, "slack 0: only the least loaded alive replica (2)"
    assert lab.PrefixAware(100).choose(views, 2100) == 0, "slack 100: the biggest alive hit (0), not the dead one"
    assert lab.PrefixAware(4).choose([ReplicaView(3, 64), ReplicaView(1, 64), ReplicaView(1, 64)], 80) == 1, \
        "equal hits: the lower load (1 or 2), then the lower index (1)"
    assert lab.PrefixAware(4).choose([ReplicaView(2, 0), ReplicaView(2, 0)], 80) == 0, "all equal: the lower index"
    assert lab.PrefixAware().choose([ReplicaView(0, 0), ReplicaView(4, 64)], 80) == 1, "the default slack is 4"
    assert lab.PrefixAware().choose([ReplicaView(0, 0), ReplicaView(5, 64)], 80) == 0, "load 5 is past slack 4"
    with pytest.raises(RuntimeError):
        lab.PrefixAware(4).choose([ReplicaView(0, 10, False), ReplicaView(1, 0, False)], 10)


# -- 9.5 autoscale_rule -----------------------------------------------------------------------------------
def spec_rule(state: FleetState, per_replica: float = 16.0, keep: float = 0.7) -> int:
    want = math.ceil((state.waiting + state.running) / per_replica)
    have = state.replicas + state.starting
    if want >= have:
        return want
    if state.starting:
        return have
    if want <= keep * state.replicas:
        return max(1, math.floor(keep * state.replicas))
    return state.replicas


@exercise("9.5")
def test_autoscale_rule_fixed_cases(lab):
    """60 queued on 2 replicas -> 4; 40 with 2 starting -> 4 (do not ask twice); 10 while 2 start on 2 -> 4
    (no shrinking while growing); 50 on 10 -> 7 (shrink by keep); 120 on 10 -> 10 (stay); 0 on 1 -> 1;
    17 on 1 -> 2 (ceil); per_replica and keep are used"""
    cases = [((2, 0, 40, 20), {}, 4), ((2, 2, 10, 30), {}, 4), ((2, 2, 4, 6), {}, 4), ((10, 0, 0, 50), {}, 7),
             ((10, 0, 0, 120), {}, 10), ((1, 0, 0, 0), {}, 1), ((1, 0, 1, 16), {}, 2), ((10, 0, 0, 112), {}, 7),
             ((10, 0, 0, 113), {}, 10), ((3, 0, 9, 0), {"per_replica": 4.0}, 3), ((10, 0, 0, 50), {"keep": 0.5}, 5),
             ((10, 0, 0, 50), {"keep": 0.3}, 10), ((10, 0, 0, 50), {"keep": 0.4}, 4), ((4, 0, 0, 0), {}, 2)]
    for (replicas, starting, waiting, running), options, want in cases:
        state = FleetState(12.0, replicas, starting, waiting, running)
        got = lab.autoscale_rule(state, **options)
        assert got == want, f"autoscale_rule({state}, {options}) = {got}, expected {want}"


@exercise("9.5")
def test_autoscale_rule_matches_the_spec_on_random_states(lab):
    """3000 seeded fleet states (1-40 replicas, 0-8 starting, queues 0-800) under seeded options (per_replica
    1.5-60, whole or not; keep 0.15-0.95) give the spec's answer"""
    rng = random.Random(905)
    for _ in range(3000):
        state = FleetState(rng.uniform(0, 600), rng.randint(1, 40), rng.choice([0, 0, 0, rng.randint(1, 8)]),
                           rng.randint(0, 400), rng.randint(0, 400))
        options = {"per_replica": rng.choice([4.0, 8.0, 32.0, round(rng.uniform(1.5, 60), 2)]),
                   "keep": rng.choice([0.25, 0.5, 0.75, round(rng.uniform(0.15, 0.95), 3)])}
        got, want = lab.autoscale_rule(state, **options), spec_rule(state, **options)
        assert got == want, f"autoscale_rule({state}, {options}) = {got}, the spec says {want}"


# -- 9.6 allreduce_bytes_per_token ------------------------------------------------------------------------
@exercise("9.6")
def test_allreduce_bytes_match_the_engines_formulas(lab):
    """for the public model shapes and 40 seeded ones (hidden 8 to 16384, 1 to 120 layers), world 1 to 16 and
    1-, 2- or 4-byte values: the ring bytes per rank of the engine's per-token all-reduce payload
    (minillm/tp/comm.py)"""
    rng = random.Random(906)
    shapes = [(name, model_shape(name)) for name in ("SmolLM2-135M", "Qwen2.5-0.5B", "Llama-3.1-8B", "Llama-3.1-70B",
                                                     "tiny")]
    shapes += [(f"seeded shape {i}", SimpleNamespace(hidden_size=rng.randint(8, 16384),
                                                     num_hidden_layers=rng.randint(1, 120))) for i in range(40)]
    for name, cfg in shapes:
        for world in range(1, 17):
            for dtype_bytes in (1, 2, 4):
                got = lab.allreduce_bytes_per_token(cfg.hidden_size, cfg.num_hidden_layers, world, dtype_bytes)
                want = ring_bytes_per_rank(allreduce_bytes_per_token(cfg, dtype_bytes), world)
                assert math.isclose(got, want, rel_tol=1e-12), \
                    (f"{name} (hidden {cfg.hidden_size}, {cfg.num_hidden_layers} layers), world {world}, "
                     f"{dtype_bytes}-byte values: {got} bytes, expected {want}")


@exercise("9.6")
def test_allreduce_bytes_fixed_cases(lab):
    """hidden 4096, 32 layers, bf16: 0 at world 1, 524288 at world 2, 786432 at 4; the default is 2 bytes;
    world 0 or negative raises ValueError"""
    assert lab.allreduce_bytes_per_token(4096, 32, 1, 2) == 0, "one rank sends nothing"
    assert math.isclose(lab.allreduce_bytes_per_token(4096, 32, 2, 2), 524288), "32 * 2 * 2 * 1/2 * 4096 * 2"
    assert math.isclose(lab.allreduce_bytes_per_token(4096, 32, 4, 2), 786432), "32 * 2 * 2 * 3/4 * 4096 * 2"
    assert math.isclose(lab.allreduce_bytes_per_token(4096, 32, 2), 524288), "dtype_bytes defaults to 2"
    for world in (0, -1, -4):
        with pytest.raises(ValueError):
            got = lab.allreduce_bytes_per_token(4096, 32, world, 2)
            raise AssertionError(f"allreduce_bytes_per_token(4096, 32, world={world}) returned {got!r}; expected a "
                                 f"ValueError")


# -- 9.E your parts in the real pieces --------------------------------------------------------------------
class ThreadAllReduce:
    """torch.distributed.all_reduce's contract for ranks running as threads: each rank's tensor, in place,
    becomes the sum over the ranks (a barrier gathers them, the last to arrive adds them up)."""

    def __init__(self, world: int) -> None:
        self.world, self.tensors, self.calls = world, {}, 0
        self.barrier = threading.Barrier(world, action=self._sum, timeout=30)

    def for_rank(self, rank: int):
        def all_reduce(t: torch.Tensor) -> None:
            self.tensors[rank] = t
            self.barrier.wait()   # the last rank in runs _sum
            self.barrier.wait()   # nobody reads before everyone has been written
        return all_reduce

    def _sum(self) -> None:
        if len(self.tensors) == self.world and all(t.numel() for t in self.tensors.values()):
            total = torch.stack(list(self.tensors.values())).sum(0)
            for t in self.tensors.values():
                t.copy_(total)
            self.tensors, self.calls = {}, self.calls + 1


@contextlib.contextmanager
def learner_shards(parts: dict):
    """The engine's tensor-parallel layers cut their weights with the learner's shard_columns / shard_rows."""
    saved = parallel_linear.shard_columns, parallel_linear.shard_rows
    parallel_linear.shard_columns, parallel_linear.shard_rows = parts["shard_columns"], parts["shard_rows"]
    try:
        yield
    finally:
        parallel_linear.shard_columns, parallel_linear.shard_rows = saved


@exercise("9.E", timeout=120)
def test_your_shards_build_a_real_tensor_parallel_model(lab):
    ("tiny sharded over 2 ranks by the engine's tensor-parallel model (minillm/tp/tp_model.py) with your "
     "shard_columns and shard_rows, the ranks running in two threads with a real all-reduce between them: "
     "the logits of a 12-token prompt equal the unsharded model's, after 2 all-reduces per layer")
    parts = lab_parts(lab, "09")
    model = bundled_model()
    ids = torch.tensor([1, 100, 200, 300, 7, 8, 9, 2000, 3000, 11, 12, 13])
    positions = torch.arange(len(ids))
    with torch.no_grad(), one_thread():
        want = model.compute_logits(model(ids, positions, None))
        reduce = ThreadAllReduce(2)
        with learner_shards(parts):
            shards = [shard_model(model, rank, 2, reduce.for_rank(rank)) for rank in range(2)]
        out, errors = [None, None], []

        def run(rank: int) -> None:
            try:
                out[rank] = shards[rank].compute_logits(shards[rank](ids, positions, None))
            except BaseException as e:  # reported below, with the rank
                errors.append(f"rank {rank}: {type(e).__name__}: {e}")
                reduce.barrier.abort()

        threads = [threading.Thread(target=run, args=(rank,)) for rank in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert not errors, f"the sharded model failed: {errors}"
    for rank in range(2):
        assert_close(out[rank], want, f"rank {rank}'s logits, tiny sharded with your functions", atol=1e-3)
    assert reduce.calls == 2 * model.config.num_hidden_layers, f"{reduce.calls} all-reduces"
    assert parts["shard_columns"].calls["shard_columns"] and parts["shard_rows"].calls["shard_rows"], \
        "the tensor-parallel layers never called your shard functions"


@exercise("9.E", timeout=120)
def test_your_tp_mlp_matches_the_engines_tensor_parallel_layers(lab):
    ("your tp_mlp_forward with your shards on tiny's last layer's MLP, world 2: equal to the engine's "
     "ColumnParallelLinear + RowParallelLinear run on the same ranks, and to the model's own MLP")
    parts = lab_parts(lab, "09")
    model = bundled_model()
    layer = model.model.layers[-1].mlp
    x = randn(990, 6, model.config.hidden_size)
    with torch.no_grad():
        gate_up, down = layer.gate_up_proj.weight.detach(), layer.down_proj.weight.detach()
        got = parts["tp_mlp_forward"](x, gate_up, down, 2, RecordingAllReduce())
        partials = []
        for rank in range(2):
            column = parallel_linear.ColumnParallelLinear(layer.gate_up_proj, rank, 2,
                                                          [model.config.intermediate_size] * 2)
            gate, up = column(x).chunk(2, dim=-1)
            row = parallel_linear.RowParallelLinear(layer.down_proj, rank, 2, lambda t: partials.append(t))
            row(F.silu(gate) * up)
        want = torch.stack(partials).sum(0)
        assert_close(got, want, "your tensor-parallel MLP against the engine's parallel layers", atol=1e-4)
        assert_close(got, layer(x), "your tensor-parallel MLP against tiny's MLP", atol=1e-4)


def by_block(pool) -> tuple[torch.Tensor, torch.Tensor]:
    """A paged pool's K and V seen block by block: [layers, num_blocks, block_size, kv_heads, head_dim]."""
    shape = (pool.k.shape[0], -1, pool.block_size, *pool.k.shape[2:])
    return pool.k.view(shape), pool.v.view(shape)


def prefill_then_transfer(pack, unpack, prompt: list[int], max_tokens: int) -> tuple[list[int], list[int]]:
    """Engine A prefills the prompt and hands it off (engine.handoff.give) with its K/V packed by `pack`;
    engine B, whose blocks are partly held by another request, admits it (engine.handoff.take) with
    `unpack` writing the K/V into its own blocks, and decodes it greedily without ever computing the prompt.
    -> (the colocated engine's tokens, B's tokens)"""
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    colocated = LLM("tiny", block_size=16, num_kv_blocks=64).generate([prompt], params, use_tqdm=False)[0]
    a, b = LLM("tiny", block_size=16, num_kv_blocks=64).engine, LLM("tiny", block_size=16, num_kv_blocks=64).engine
    b.add_request(list(range(5, 60)), SamplingParams(max_tokens=40, ignore_eos=True))  # holds B's first blocks
    b.step()
    a.add_request(prompt, params, request_id="moved")
    a.step()  # the prefill: the prompt's K/V in A's pool, and the first token
    sent_from = next(s.block_table for s in a.view.sequences() if s.request_id == "moved")
    prefilled = a.handoff.give("moved", lambda pool, blocks, n: pack(*by_block(pool), blocks, n))
    chunks = b.handoff.take(prefilled, params, "moved", lambda buffer, pool, blocks: unpack(buffer, *by_block(pool),
                                                                                             blocks))
    assert chunks is not None, "engine B had room for the transferred request"
    received_in = next(s.block_table for s in b.view.sequences() if s.request_id == "moved")
    assert received_in[:len(sent_from)] != sent_from, "the test needs other block ids in the receiving engine"
    tokens = [t for c in chunks for t in c.token_ids]
    while b.has_unfinished():
        tokens += [t for c in b.step() if c.request_id == "moved" for t in c.token_ids]
    return colocated.token_ids, tokens


@exercise("9.E", timeout=120)
def test_your_kv_transfer_moves_a_prompt_between_two_real_engines(lab):
    ("a 37-token prompt prefilled by one tiny engine and handed off with its K/V packed by your pack_kv, admitted by "
     "another engine with your unpack_kv writing it into its own blocks (other block ids, a partial last block), "
     "which decodes it without computing the prompt: the greedy continuation equals the prompt's on one engine")
    parts = lab_parts(lab, "09")
    prompt = LLM("tiny").tokenizer.encode("def fibonacci(n):\n    if n < 2:\n        return n\n    return fib")[:37]
    with one_thread():
        mine = prefill_then_transfer(parts["pack_kv"], parts["unpack_kv"], prompt, 12)
    assert len(prompt) % 16, "the prompt must end in a partial block"
    assert mine[1] == mine[0], (f"after your transfer the receiving engine generated {mine[1]}; the same prompt "
                                f"on one engine generates {mine[0]}")


FLEET = StepProfile.from_roofline(model_shape("Llama-3.1-8B"), PROFILES["H100 SXM"])


@functools.cache
def reference_routing(replicas: int, sessions: int) -> dict:
    result = simulate([], FLEET, replicas=replicas, router="prefix_aware",
                      sessions=agent_sessions(sessions, rate=sessions / 30, seed=9), kv_blocks=20_000)
    return {"hits": summary(result.requests)["prefix_hit_rate"], "placed": [r.replica for r in result.requests]}


@exercise("9.E", timeout=120)
def test_your_routing_policy_in_the_simulator(lab):
    ("your PrefixAware(4) routing 60 agent sessions of 16 tenants over 16 simulated replicas places every call "
     "where the engine's policy does and reaches its prefix hit rate; on constructed fleets in the simulator "
     "a dead replica gets nothing")
    parts = lab_parts(lab, "09")
    want = reference_routing(16, 60)
    result = simulate([], FLEET, replicas=16, router=parts["PrefixAware"](4),
                      sessions=agent_sessions(60, rate=2.0, seed=9), kv_blocks=20_000)
    hits = summary(result.requests)["prefix_hit_rate"]
    assert hits >= want["hits"] - 1e-9, \
        f"prefix hit rate {hits:.1%} with your policy, the reference's {want['hits']:.1%}"
    placed = [r.replica for r in result.requests]
    assert placed == want["placed"], "your policy placed calls on other replicas than the engine's policy: " + \
        f"first difference at call {next(i for i, (p, q) in enumerate(zip(placed, want['placed'])) if p != q)}"


@exercise("9.E", timeout=120)
def test_your_routing_policy_in_the_real_routers_replica_picker(lab):
    ("the router's RouterState (its PrefixIndex of what each replica was sent) with your PrefixAware picks the "
     "replicas the engine's policy picks for 200 prompts of 8 tenants' shared prefixes, with a dead replica")
    parts = lab_parts(lab, "09")
    urls = [f"http://127.0.0.1:{9000 + i}" for i in range(4)]
    rng = random.Random(99)
    systems = [[rng.randrange(4096) for _ in range(rng.randint(20, 90))] for _ in range(8)]
    prompts = [systems[rng.randrange(8)] + [rng.randrange(4096) for _ in range(rng.randint(1, 30))] for _ in range(200)]
    picks = []
    for policy in (parts["PrefixAware"](2), PrefixAware(2)):
        state = RouterState(urls, policy="prefix_aware", block_size=16)
        state.policy = policy
        state.mark_dead(state.replicas[3], "test: down")
        chosen, in_flight = [], []
        for i, prompt in enumerate(prompts):
            replica = state.pick(prompt)
            chosen.append(state.replicas.index(replica))
            in_flight.append(replica)
            if i % 3 == 2:  # requests finish in their order, leaving a few in flight
                state.release(in_flight.pop(0))
        picks.append(chosen)
    assert 3 not in picks[0], "your policy routed to a dead replica"
    first = next((i for i, (p, q) in enumerate(zip(*picks)) if p != q), None)
    assert first is None, \
        f"prompt {first}: your policy picked replica {picks[0][first]}, the reference {picks[1][first]}"


def waves(seed: int = 0, period: float = 60.0, low: float = 1.0, high: float = 12.0, total: float = 240.0):
    gen = torch.Generator().manual_seed(seed)
    t, out = 0.0, []
    while t < total:
        t += torch.empty(1).exponential_(high if (t // (period / 2)) % 2 else low, generator=gen).item()
        out.append(SimRequest(t, int(torch.randint(200, 1500, (1,), generator=gen)),
                              int(torch.randint(50, 400, (1,), generator=gen)), request_id=f"r{len(out)}"))
    return out


def autoscaled(rule) -> tuple[float, float]:
    scaler = Autoscaler(rule, interval=5, startup_seconds=20, max_replicas=32)
    result = simulate(waves(seed=4), FLEET, replicas=2, router="least_loaded", autoscaler=scaler, kv_blocks=20_000,
                      max_num_seqs=32)
    return summary(result.requests, {"ttft": 1.0, "tpot": 0.05})["slo_attainment"], result.replica_seconds


@functools.cache
def reference_autoscaled() -> tuple[float, float]:
    return autoscaled(spec_rule)


@exercise("9.E", timeout=120)
def test_your_autoscaling_rule_meets_the_slo_at_the_references_cost(lab):
    ("the simulator's autoscaler with your rule on traffic swinging between 1 and 12 requests/s (startup 20 s): "
     "SLO attainment within 1 point of the reference rule's, at most 5% more replica-seconds")
    parts = lab_parts(lab, "09")
    attainment, cost = autoscaled(parts["autoscale_rule"])
    want_attainment, want_cost = reference_autoscaled()
    assert attainment >= want_attainment - 0.01, \
        f"your rule met the SLO for {attainment:.1%} of requests, the reference rule for {want_attainment:.1%}"
    assert cost <= want_cost * 1.05, f"your rule held {cost:.0f} replica-seconds, the reference {want_cost:.0f}"
