"""EngineConfig.from_knobs(compile_decode=True): decode steps through torch.compile give what the eager engine gives.

One compiled engine serves the whole module: each new shape of decode batch (one sequence, several
of unequal lengths) compiles once, for tens of seconds on a 2-core CPU.
"""
import pytest
import torch
import torch._dynamo
from test_paged_engine import GREEDY, prompts

from minillm import LLM, QuantConfig, SamplingParams
from minillm.config import EngineConfig

pytestmark = pytest.mark.slow  # torch.compile builds each graph (minutes on a CPU)


@pytest.fixture(scope="module")
def engines(hf_llama):
    """(eager, compiled) over the same checkpoint. Blocks of 8 so that contexts cross blocks; a budget
    of 16 tokens a step so that a long prompt's chunks share steps with decodes (mixed steps, eager)."""
    knobs = dict(block_size=8, num_kv_blocks=64, max_num_batched_tokens=16)
    return LLM(str(hf_llama[0]), **knobs), LLM(str(hf_llama[0]), compile_decode=True, **knobs)


def test_compiled_greedy_decode_equals_eager_for_one_and_for_rows_of_unequal_length(engines):
    eager, compiled = engines
    torch._dynamo.utils.counters.clear()
    params = SamplingParams(max_tokens=14, **GREEDY)
    for batch in (prompts([11]), prompts([5, 23, 16, 9], seed=1)):  # 23 and 9 end mid-block; rows padded
        assert ([o.token_ids for o in compiled.generate(batch, params, use_tqdm=False)]
                == [o.token_ids for o in eager.generate(batch, params, use_tqdm=False)])
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 2  # one row, then rows of unequal length
    assert compiled.engine.view.kv_stats().used_blocks == 0


def test_compiled_logprobs_equal_eager_with_mixed_steps_between_decodes(engines):
    """A 40-token prompt prefills in 16-token chunks beside a short one's decodes: the mixed steps
    run eager and write K/V the compiled decode steps then read, and the other way round."""
    eager, compiled = engines
    params = SamplingParams(max_tokens=12, logprobs=5, **GREEDY)
    batch = prompts([7, 40], seed=2)
    outs = [llm.generate(batch, params, use_tqdm=False) for llm in engines]
    for ours, theirs in zip(*outs):
        assert ours.token_ids == theirs.token_ids
        for mine, ref in zip(ours.outputs[0].logprobs, theirs.outputs[0].logprobs):
            assert mine.keys() == ref.keys()
            assert max(abs(mine[t] - ref[t]) for t in ref) < 1e-4


def test_compiled_sampling_with_n_and_seeds_equals_eager(engines):
    eager, compiled = engines
    params = SamplingParams(max_tokens=10, temperature=0.8, top_p=0.9, n=3, seed=7)
    batch = prompts([9, 17], seed=3)
    assert ([[c.token_ids for c in o.outputs] for o in compiled.generate(batch, params, use_tqdm=False)]
            == [[c.token_ids for c in o.outputs] for o in eager.generate(batch, params, use_tqdm=False)])


@pytest.mark.parametrize("knob, value, named", [
    ("kv_cache", "contiguous", "kv_cache='paged'"),
    ("tensor_parallel_size", 2, "tensor_parallel_size=1"),
    ("quantization", QuantConfig(scheme="int8"), "quantization=None"),
    ("compile_decode", "yes", "compile_decode must be True or False"),
])
def test_compile_decode_refuses_what_it_does_not_run(knob, value, named):
    config = {"compile_decode": True, knob: value}
    with pytest.raises(ValueError, match=named.replace("(", r"\(").replace(")", r"\)")):
        EngineConfig.from_knobs(**config)
