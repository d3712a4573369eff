"""A decode step's decoder layers as one C++ call each (models/cpu_decode.py) against the layers' own path: the same
hidden states to the bit, step by step, for 1 to 4 rows of every context length (block edges, the last block
partial), odd shapes with biases, one and two threads; and the layers' own path wherever the C++ layer cannot run."""
import pytest
import torch

from minillm import LLM, EngineConfig, QuantConfig, SamplingParams
from minillm.engine.engine import LLMEngine
from minillm.layers import cpu_ops
from minillm.models import cpu_decode
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


def hidden_per_step(engine: LLMEngine, prompts: list[list[int]], lengths: list[int]) -> list[torch.Tensor]:
    """Greedy steps to the end of every request (each its own max_tokens, so the batch shrinks one row at a time)
    -> the sampled rows' hidden states of every step."""
    for prompt, n in zip(prompts, lengths):
        engine.add_request(prompt, SamplingParams(max_tokens=n, temperature=0, ignore_eos=True))
    hidden = []
    while engine.has_unfinished():
        engine.step()
        hidden.append(engine.runner.last_hidden.clone())
    return hidden


def engines(model: str, **overrides) -> tuple[LLMEngine, LLMEngine]:
    """(C++ layers, the layers' own path) on the same weights; no prefix cache, so both compute every prompt alike."""
    fused = LLMEngine(EngineConfig(model=model, enable_prefix_caching=False, **overrides))
    plain = LLMEngine(EngineConfig(model=model, enable_prefix_caching=False, cpu_decode_layers=False, **overrides),
                      model=fused.model)
    return fused, plain


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("block_size", [16, 4])
@pytest.mark.parametrize("model", ["tiny", "odd"])
def test_the_cpp_layers_equal_the_layers_own_path_to_the_bit(model, block_size, threads, odd_model, fused_calls):
    """Seeded prompt lengths from 1 token to past three blocks, 1 to 6 sequences (5 and 6 rows take the layers' own
    path: the C++ products stop at 4), each with its own length of output."""
    torch.set_num_threads(threads)
    try:
        fused, plain = engines(odd_model if model == "odd" else model, block_size=block_size, max_num_seqs=6)
        gen = torch.Generator().manual_seed(block_size + threads)
        for batch in range(1, 7):
            lengths = torch.randint(1, 3 * block_size + 5, (batch,), generator=gen).tolist()
            prompts = [torch.randint(1, 300, (n,), generator=gen).tolist() for n in lengths]
            outputs = torch.randint(2, 2 * block_size, (batch,), generator=gen).tolist()
            ours = hidden_per_step(fused, prompts, outputs)
            calls = len(fused_calls)
            theirs = hidden_per_step(plain, prompts, outputs)
            assert len(fused_calls) == calls, "cpu_decode_layers=False must run the layers' own path"
            assert len(ours) == len(theirs)
            for step, (a, b) in enumerate(zip(ours, theirs)):
                assert torch.equal(a, b), f"{batch} sequences, step {step}: differs by {(a - b).abs().max():.3g}"
        layers = fused.model.config.num_hidden_layers
        assert fused_calls and len(fused_calls) % layers == 0 and fused_calls[:layers] == list(range(layers))
    finally:
        torch.set_num_threads(1)


def test_a_replaced_weight_is_read_from_its_new_tensor(fused_calls):
    """The layer's struct of pointers is kept between steps; a weight replaced by another tensor must be read from the
    new one (the old one could be freed), as the layers' own path reads it."""
    fused, plain = engines("tiny")
    prompts, lengths = [[5, 6, 7]], [6]
    hidden_per_step(fused, prompts, lengths)  # the structs are made and kept
    o_proj = fused.model.model.layers[1].self_attn.o_proj
    o_proj.weight = torch.nn.Parameter(o_proj.weight.detach() * -0.5, requires_grad=False)
    ours, theirs = hidden_per_step(fused, prompts, lengths), hidden_per_step(plain, prompts, lengths)
    assert fused_calls and all(torch.equal(a, b) for a, b in zip(ours, theirs))


@pytest.mark.parametrize("case", ["one quantized layer", "bfloat16", "no C++ attention kernel", "a prefill"])
def test_the_layers_own_path_runs_where_the_cpp_layer_cannot(case, fused_calls):
    overrides = {"one quantized layer": dict(quantization=QuantConfig("int8", layers=(1,))),
                 "bfloat16": dict(dtype="bfloat16"), "no C++ attention kernel": dict(cpu_decode_kernel=False),
                 "a prefill": {}}[case]
    llm = LLM("tiny", **overrides)
    params = SamplingParams(max_tokens=1 if case == "a prefill" else 8, temperature=0, ignore_eos=True)
    assert llm.generate(["def fib(n):"], params, use_tqdm=False)[0].token_ids
    assert fused_calls == []


def test_the_switch_is_checked():
    with pytest.raises(TypeError, match="cpu_decode_layers must be True or False"):
        EngineConfig(model="tiny", cpu_decode_layers=1)
