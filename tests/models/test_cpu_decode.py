"""A decode step's decoder layers as one C++ call each (models/cpu_decode.py) against the layers' own path: the same
logits to the bit, step by step, for 1 to 8 rows of every context length (block edges, the last block partial),
odd shapes with biases, quantized layers, one and two threads; the layers' own path where the C++ layer cannot run."""
import copy
import pickle

import pytest
import torch

from minillm import LLM, EngineConfig, QuantConfig, SamplingParams
from minillm.layers import cpu_ops
from minillm.models import cpu_decode
from minillm.quant import fused as fused_kernels
from minillm.testing import make_hf_model

pytestmark = pytest.mark.skipif(cpu_ops.library() is None, reason="no C++ compiler: the layers run PyTorch only")


@pytest.fixture(scope="module")
def odd_model(tmp_path_factory):
    """Qwen2-style (q/k/v biases, tied embeddings), head_dim 18 and an intermediate size of 100: every vector loop's
    tail runs, in the norms, the products, rotary and attention."""
    path = tmp_path_factory.mktemp("odd")
    make_hf_model(path, "qwen2", seed=3, hidden_size=72, intermediate_size=100, num_attention_heads=4,
                  num_key_value_heads=2, num_hidden_layers=3)
    return str(path)


@pytest.fixture
def fused_calls(monkeypatch):
    """How many layers ran through the C++ call."""
    calls = []
    run = cpu_decode.CpuDecode.run
    monkeypatch.setattr(cpu_decode.CpuDecode, "run", lambda self, i, h, x: calls.append(i) or run(self, i, h, x))
    return calls


def outputs(llm: LLM, prompts: list[list[int]], lengths: list[int]) -> list[tuple[list[int], list[dict]]]:
    """Greedy to the end of every request (each its own max_tokens, so the batch shrinks a row at a time) -> each
    request's tokens and the log-probabilities of its 20 likeliest tokens at every step: equal to the last bit only
    where every step's logits were."""
    params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True, logprobs=20) for n in lengths]
    return [(o.token_ids, o.outputs[0].logprobs) for o in llm.generate(prompts, params, use_tqdm=False)]


def engines(model: str, **overrides) -> tuple[LLM, LLM]:
    """(C++ layers, the layers' own path) on the same weights (quantized once, by the first); no prefix cache, so
    both compute every prompt alike."""
    fused = LLM(model, enable_prefix_caching=False, **overrides)
    overrides.pop("quantization", None)
    return fused, LLM(model, weights=fused.model, enable_prefix_caching=False, cpu_decode_layers=False, **overrides)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("block_size", [16, 4])
@pytest.mark.parametrize("model", ["tiny", "odd"])
def test_the_cpp_layers_equal_the_layers_own_path_to_the_bit(model, block_size, threads, odd_model, fused_calls):
    """Seeded prompt lengths from 1 token to past three blocks, 1 to cpu_ops.MAX_ROWS + 1 sequences (more rows than
    cpu_ops.MAX_ROWS take the layers' own path: the C++ products stop there), each with its own length of output."""
    torch.set_num_threads(threads)
    try:
        most = cpu_ops.MAX_ROWS + 1
        fused, plain = engines(odd_model if model == "odd" else model, block_size=block_size, max_num_seqs=most)
        gen = torch.Generator().manual_seed(block_size + threads)
        for batch in (1, 2, 3, 4, 5, 8, 13, 17, 24, most):
            lengths = torch.randint(1, 3 * block_size + 5, (batch,), generator=gen).tolist()
            prompts = [torch.randint(1, 300, (n,), generator=gen).tolist() for n in lengths]
            new = torch.randint(2, 2 * block_size, (batch,), generator=gen).tolist()
            ours = outputs(fused, prompts, new)
            calls = len(fused_calls)
            theirs = outputs(plain, prompts, new)
            assert len(fused_calls) == calls, "cpu_decode_layers=False must run the layers' own path"
            for i, (a, b) in enumerate(zip(ours, theirs)):
                assert a == b, f"{batch} sequences: request {i} differs"
        layers = fused.model.config.num_hidden_layers
        assert fused_calls and len(fused_calls) % layers == 0 and fused_calls[:layers] == list(range(layers))
    finally:
        torch.set_num_threads(1)


def test_a_replaced_weight_is_read_from_its_new_tensor(fused_calls):
    """The layer's struct of pointers is kept between steps; a weight replaced by another tensor must be read from the
    new one (the old one could be freed), as the layers' own path reads it."""
    fused, plain = engines("tiny")
    prompts, lengths = [[5, 6, 7]], [6]
    outputs(fused, prompts, lengths)  # the structs are made and kept
    o_proj = fused.model.model.layers[1].self_attn.o_proj
    o_proj.weight = torch.nn.Parameter(o_proj.weight.detach() * -0.5, requires_grad=False)
    assert outputs(fused, prompts, lengths) == outputs(plain, prompts, lengths) and fused_calls


@pytest.mark.parametrize("quantization", [QuantConfig("int8"), QuantConfig("int4", group_size=32),
                                          QuantConfig("int4", group_size=32, int4_range="min-max"),
                                          QuantConfig("int4", layers=(0,), projections=("o_proj", "down_proj"))],
                         ids=["int8", "int4-g32", "int4-g32-minmax", "int4-partial"])
def test_quantized_layers_run_their_own_kernels_inside_the_cpp_layer(quantization, fused_calls):
    """A quantized product is computed inside the C++ layer by the kernel the quantized layer itself calls
    (quant/fused_matvec.cpp): the same logits to the bit, for whole and partial quantization; and a step of more
    rows than those kernels take (fused.MAX_ROWS) runs the layers' own path, as the quantized layers then do."""
    fused, plain = engines("tiny", quantization=quantization, max_num_seqs=fused_kernels.MAX_ROWS + 3)
    gen = torch.Generator().manual_seed(7)
    for lengths, new in [((3, 17, 40), [9, 14, 5]), ((2,) * (fused_kernels.MAX_ROWS + 3), [2, 4, 6] * 6 + [3])]:
        prompts = [torch.randint(1, 300, (n,), generator=gen).tolist() for n in lengths]
        ours = outputs(fused, prompts, new[:len(prompts)])
        calls = len(fused_calls)
        assert outputs(plain, prompts, new[:len(prompts)]) == ours, f"{len(prompts)} sequences"
        assert calls and len(fused_calls) == calls


def test_a_short_chunk_runs_as_decode_rows_of_one_sequence(fused_calls):
    """A chunk of a few tokens (speculative verification, a short prompt) attends as one decode row per token, each
    to its own position, so it takes the C++ layer too; its tokens and log-probabilities equal the gather path's
    (SDPA, causal) within float rounding."""
    fused = LLM("tiny", enable_prefix_caching=False)
    outputs(fused, [[5, 6, 7]], [1])
    assert fused_calls == list(range(fused.model.config.num_hidden_layers))
    gather = LLM("tiny", weights=fused.model, enable_prefix_caching=False, cpu_decode_kernel=False)
    gen = torch.Generator().manual_seed(11)
    for n in (2, 4, 9, 16, 17):  # 17: past SHORT_CHUNK, a prefill
        ids = torch.randint(1, 300, (n,), generator=gen).tolist()
        (ours, our_logprobs), = outputs(fused, [ids], [12])
        (theirs, their_logprobs), = outputs(gather, [ids], [12])
        assert ours == theirs
        for a, b in zip(our_logprobs, their_logprobs):
            torch.testing.assert_close(torch.tensor([a[t] for t in sorted(a)]), torch.tensor([b[t] for t in sorted(a)]),
                                       rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case", ["fp8", "bfloat16", "no C++ attention kernel", "a long prefill"])
def test_the_layers_own_path_runs_where_the_cpp_layer_cannot(case, fused_calls):
    overrides = {"fp8": dict(quantization=QuantConfig("fp8")), "bfloat16": dict(dtype="bfloat16"),
                 "no C++ attention kernel": dict(cpu_decode_kernel=False), "a long prefill": {}}[case]
    llm = LLM("tiny", **overrides)
    params = SamplingParams(max_tokens=1 if case == "a long prefill" else 8, temperature=0, ignore_eos=True)
    assert llm.generate([list(range(5, 30))], params, use_tqdm=False)[0].token_ids
    assert fused_calls == []


def test_a_weight_moved_in_place_is_read_where_it_is_now(fused_calls):
    """`.data =` keeps the Parameter and moves its memory (models/huge_pages.py does it): the kept struct must
    follow, not read the old address."""
    fused, plain = engines("tiny")
    prompts, lengths = [[5, 6, 7]], [6]
    outputs(fused, prompts, lengths)
    down = fused.model.model.layers[0].mlp.down_proj.weight
    down.data = down.data * 1.5
    assert outputs(fused, prompts, lengths) == outputs(plain, prompts, lengths)


def test_a_weight_changed_in_place_is_read_as_it_is_now(fused_calls):
    """The same memory with new values (a new version): the C++ product's panel copy of it, where it reads one, must
    be made again, and the kept struct must point at the new copy."""
    fused, plain = engines("tiny")
    prompts, lengths = [[5, 6, 7]], [6]
    outputs(fused, prompts, lengths)
    gate_up = fused.model.model.layers[1].mlp.gate_up_proj.weight
    assert not gate_up.is_inference()  # else it would have no version to tell the change by
    with torch.no_grad():
        gate_up.mul_(-0.75)
    assert outputs(fused, prompts, lengths) == outputs(plain, prompts, lengths) and fused_calls


def test_a_model_that_ran_the_cpp_layer_deep_copies_and_pickles(fused_calls):
    """The struct kept on each layer holds raw pointers: copies leave it out and make their own."""
    fused = LLM("tiny", enable_prefix_caching=False)
    prompts, lengths = [[5, 6, 7], [9] * 20], [6, 3]
    ours = outputs(fused, prompts, lengths)
    assert fused_calls
    for twin in (copy.deepcopy(fused.model), pickle.loads(pickle.dumps(fused.model))):
        assert "_cpu_decode" not in twin.model.layers[0].__dict__
        for layers in (True, False):  # the copy through the C++ layer, and one operator at a time
            assert outputs(LLM("tiny", weights=twin, enable_prefix_caching=False, cpu_decode_layers=layers), prompts,
                           lengths) == ours


def test_the_switch_is_checked():
    with pytest.raises(TypeError, match="cpu_decode_layers must be True or False"):
        EngineConfig.from_knobs("tiny", cpu_decode_layers=1)
