"""Tensor parallelism (minillm/distributed): the sharding functions against the unsharded matmul, shards
run in threads against the whole model, and TP=2 over gloo processes against TP=1 (greedy tokens
identical, logits within float rounding), the all-reduce count against its closed form, and a
killed worker against a hang."""
import os
import signal
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from minillm import LLM, SamplingParams
from minillm.models.prepare import load_model
from minillm.models.registry import resolve_model_path
from minillm.tp.comm import allreduce_bytes_per_token, ring_bytes_per_rank
from minillm.tp.parallel_linear import (
    ColumnParallelLinear,
    RowParallelLinear,
    row_parallel,
    shard_columns,
    shard_rows,
)
from minillm.tp.tp_model import shard_model, tp_config

GREEDY = SamplingParams(max_tokens=6, temperature=0)


class ThreadGroup:
    """An all-reduce among `world` threads of this process: a stand-in for a process group."""

    def __init__(self, world: int) -> None:
        self.world, self.barrier, self.parts = world, threading.Barrier(world), {}

    def all_reduce(self, rank: int):
        def reduce(t: torch.Tensor) -> None:
            self.parts[rank] = t.clone()
            self.barrier.wait()
            total = sum(self.parts[r] for r in range(self.world))  # the same order on every rank
            self.barrier.wait()
            t.copy_(total)
        return reduce

    def run(self, fn):
        """fn(rank) on every rank at once -> [result of rank 0, 1, ...]"""
        def on_rank(rank):
            with torch.inference_mode():  # a thread-local mode: each rank's thread enters it
                return fn(rank)
        with ThreadPoolExecutor(self.world) as pool:
            return list(pool.map(on_rank, range(self.world)))


def signed(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.parametrize("world", [1, 3])
def test_column_shards_concatenate_to_the_unsharded_product(world):
    x, w = signed(7, 9), signed(15, 9, seed=1)  # out 15 != in 9: a cut along the wrong dimension shows
    shards = [shard_columns(w, r, world) for r in range(world)]
    assert all(s.shape == (15 // world, 9) for s in shards)
    torch.testing.assert_close(torch.cat([x @ s.T for s in shards], dim=1), x @ w.T)


@pytest.mark.parametrize("world", [1, 3])
def test_row_shards_sum_to_the_unsharded_product(world):
    x, w = signed(7, 9), signed(4, 9, seed=1)
    cut = 9 // world
    shards = [shard_rows(w, r, world) for r in range(world)]
    assert all(s.shape == (4, cut) for s in shards)
    partials = [x[:, r * cut:(r + 1) * cut] @ s.T for r, s in enumerate(shards)]
    torch.testing.assert_close(sum(partials), x @ w.T)


def test_row_parallel_all_reduces_and_adds_the_bias_once():
    x, w, bias = signed(5, 12), signed(7, 12, seed=1), signed(7, seed=2)
    group = ThreadGroup(4)
    outs = group.run(lambda r: row_parallel(x[:, 3 * r:3 * r + 3], shard_rows(w, r, 4), group.all_reduce(r), bias))
    for out in outs:  # every rank holds the whole result
        torch.testing.assert_close(out, x @ w.T + bias)


def test_fused_column_layer_keeps_matching_slices_of_each_part():
    """q (4 rows), k (2), v (2) fused: rank r must get its slice of each, not a slice of the stack."""
    full = torch.nn.Linear(6, 8, bias=True).double()
    x = signed(3, 6)
    q, k, v = (x @ full.weight.T + full.bias).split([4, 2, 2], dim=1)
    for r in range(2):
        out = ColumnParallelLinear(full, r, 2, parts=[4, 2, 2])(x)
        expected = torch.cat([q[:, 2 * r:2 * r + 2], k[:, r:r + 1], v[:, r:r + 1]], dim=1)
        torch.testing.assert_close(out, expected.detach())


def test_row_parallel_layer_equals_the_whole_layer():
    full = torch.nn.Linear(10, 3, bias=False).double()
    x = signed(4, 10)
    group = ThreadGroup(2)
    outs = group.run(lambda r: RowParallelLinear(full, r, 2, group.all_reduce(r))(x[:, 5 * r:5 * r + 5]))
    torch.testing.assert_close(outs[1], (x @ full.weight.T).detach())


def test_a_world_size_that_does_not_divide_the_heads_is_refused():
    cfg = load_model(resolve_model_path("tiny"), torch.float32, torch.device("cpu")).config
    with pytest.raises(ValueError, match=r"tensor_parallel_size 3 .* num_attention_heads \(8\).*\[1, 2, 4\]"):
        tp_config(cfg, 3)
    with pytest.raises(ValueError, match=r"num_key_value_heads \(4\)"):
        LLM("tiny", tensor_parallel_size=8)  # divides the 8 query heads, not the 4 kv heads: refused before spawning


@pytest.mark.parametrize("world", [2, 4])
def test_shards_in_threads_give_the_whole_models_logits(world):
    model = load_model(resolve_model_path("tiny"), torch.float32, torch.device("cpu"))
    ids = torch.tensor([5, 900, 17, 4000, 3, 250, 77, 1024, 8, 9, 2048])
    positions = torch.arange(len(ids))
    with torch.inference_mode():
        expected = model.compute_logits(model(ids, positions))
        group = ThreadGroup(world)
        shards = [shard_model(model, r, world, group.all_reduce(r)) for r in range(world)]
        hidden = group.run(lambda r: shards[r](ids, positions))
        logits = model.compute_logits(hidden[0])
    assert shards[1].config.num_key_value_heads == 4 // world
    for h in hidden[1:]:
        torch.testing.assert_close(h, hidden[0], rtol=0, atol=0)  # every rank ends with the same hidden states
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-4)


def test_config_refuses_what_tensor_parallelism_does_not_support():
    from minillm.config import EngineConfig
    with pytest.raises(ValueError, match="tensor_parallel_size must be an integer >= 1, got 0"):
        EngineConfig.from_knobs(tensor_parallel_size=0)
    with pytest.raises(ValueError, match="kv_cache='paged'.*got kv_cache='contiguous'"):
        EngineConfig.from_knobs(tensor_parallel_size=2, kv_cache="contiguous")


PROMPTS = ["def fib(n):", "import os\n", "class Stack:\n    def push(self, item):\n"]
# Longer than the step's token budget (chunked prefill) and several 16-token blocks long.
LONG = "def parse(line):\n" + "".join(f"    field_{i} = line.split(',')[{i}]\n" for i in range(14))


@pytest.fixture(scope="class")
def llms():
    """(TP=1, TP=2) LLMs, the second with one worker process, stopped after the class: torch.distributed
    allows one group per process, and the killed-worker test starts its own."""
    config = dict(max_num_batched_tokens=64, block_size=16)
    reference = LLM("tiny", **config)
    tp = LLM("tiny", tensor_parallel_size=2, **config)
    yield reference, tp
    tp.model.shutdown()


@pytest.mark.subprocess
@pytest.mark.timeout(180)
class TestTwoRanks:

    def test_greedy_tokens_equal_one_rank(self, llms):
        reference, tp = llms
        prompts = [*PROMPTS, LONG, "while True:"]
        assert len(reference.tokenizer.encode(LONG)) > 2 * 64  # prefilled in several chunks, many blocks
        # Two samples fork the prompt's blocks and copy the shared last one when they write it:
        # the workers must repeat that copy in their pools.
        params = [GREEDY] * len(PROMPTS) + [GREEDY, SamplingParams(max_tokens=6, temperature=0, n=2)]
        expected = [[c.token_ids for c in o.outputs] for o in reference.generate(prompts, params)]
        got = [[c.token_ids for c in o.outputs] for o in tp.generate(prompts, params)]
        assert got == expected

    def test_logits_equal_one_rank_within_rounding(self, llms):
        reference, tp = llms
        ids = reference.tokenizer.encode(LONG)[:100]
        torch.testing.assert_close(tp.logits(ids), reference.logits(ids), rtol=0, atol=1e-4)

    def test_bytes_all_reduced_equal_the_formula(self, llms):
        _, tp = llms
        tp.model.all_reduce.reset()
        outs = tp.generate(PROMPTS, GREEDY)
        # Fed to the model: the prompt less its prefix-cache hits, and each new token but the last.
        tokens = sum(len(o.prompt_token_ids) - o.outputs[0].metrics["cached_prompt_tokens"] + len(o.token_ids) - 1
                     for o in outs)
        cfg = tp.model.config
        per_token = 2 * cfg.num_hidden_layers * cfg.hidden_size * 4  # two [tokens, hidden] float32 sums per layer
        meter = tp.model.all_reduce
        assert (meter.tokens, meter.bytes) == (tokens, per_token * tokens)
        assert allreduce_bytes_per_token(cfg, 4) == per_token == 12288
        assert meter.calls == 2 * cfg.num_hidden_layers * meter.steps
        assert ring_bytes_per_rank(per_token, 2) == per_token  # N=2: each rank sends half twice
        assert ring_bytes_per_rank(per_token, 4) == 1.5 * per_token


@pytest.mark.subprocess
@pytest.mark.timeout(120)
def test_a_killed_worker_fails_the_caller_clearly_and_leaves_no_process():
    llm = LLM("tiny", tensor_parallel_size=4)  # three workers: the two survivors must be stopped too
    pids = llm.model.worker_pids
    try:
        stream = llm.stream("def f(x):", SamplingParams(max_tokens=100, temperature=0))
        for _ in range(3):
            next(stream)
        os.kill(pids[1], signal.SIGKILL)  # mid-request
        # The error names the signal: the driver saw the death itself, it did not wait out a timeout.
        with pytest.raises(RuntimeError, match=rf"worker rank 2 \(pid {pids[1]}\) was killed by signal 9"):
            list(stream)
        with pytest.raises(RuntimeError, match=r"the tensor-parallel group is stopped \(worker rank 2"):
            llm.generate(["x = 1"], GREEDY)
    finally:
        llm.model.shutdown()
    for pid in pids:  # reaped, not merely dead: the driver waited for each
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
