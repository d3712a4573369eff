"""The engine on the Triton kernels (EngineConfig.from_knobs(attention_backend="triton")): the same greedy tokens
as the torch backend on the bundled tiny model, through paged blocks, prefix hits, chunked prefill
and batching, and int4 layers on the fused dequantize-matmul. Few tokens: the CPU interpreter is slow."""
import pytest

from minillm import LLM, EngineConfig, QuantConfig, SamplingParams
from minillm.config import Components

# Before any kernel is defined: minillm's runtime sets TRITON_INTERPRET=1 when there is no GPU.
pytest.importorskip("minillm.kernels.runtime", reason="the Triton kernels need the triton package (Linux only): "
                                                      "pip install -e '.[triton]'")

GREEDY = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
SHARED = "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n"


def generate_twice(backend: str, **config) -> tuple[list[list[int]], list[int]]:
    """One prompt (in chunks of 32 tokens), then a batch of two, one reusing its prefix: -> (token ids of
    all three, cached prompt tokens). A small pool: the interpreter copies each argument's storage."""
    llm = LLM("tiny", attention_backend=backend, block_size=8, max_num_batched_tokens=32, num_kv_blocks=64, **config)
    first = llm.generate([SHARED + "print("], GREEDY, use_tqdm=False)
    batch = llm.generate([SHARED + "x = [fibonacci", "import os\n"], GREEDY, use_tqdm=False)
    outs = first + batch
    return [o.token_ids for o in outs], [o.metrics["cached_prompt_tokens"] for o in outs]


def test_triton_backend_generates_the_torch_backends_greedy_tokens():
    torch_tokens, _ = generate_twice("torch")
    triton_tokens, cached = generate_twice("triton")
    assert triton_tokens == torch_tokens
    assert cached[0] == 0 and cached[1] > 0, f"no prefix hit exercised: {cached}"


def test_triton_backend_runs_int4_layers_on_the_fused_kernel():
    from minillm.quant.quantized_linear import QuantizedLinear, int4_linear_triton
    quant, params = QuantConfig("int4", group_size=32, layers=(0,)), SamplingParams(max_tokens=2, temperature=0)
    prompts = ["class Stack:", "import os"]
    want = [o.token_ids for o in LLM("tiny", quantization=quant).generate(prompts, params, use_tqdm=False)]
    llm = LLM("tiny", quantization=quant, attention_backend="triton", num_kv_blocks=16)
    layers = [m for m in llm.engine.model.modules() if isinstance(m, QuantizedLinear)]
    assert layers and all(m.ops.int4_linear is int4_linear_triton for m in layers)
    assert [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)] == want


def test_triton_backend_runs_a_loaded_int4_checkpoint_on_the_fused_kernel(tmp_path):
    from minillm.quant import save_quantized
    from minillm.quant.quantized_linear import QuantizedLinear, int4_linear_triton
    quant, params = QuantConfig("int4", group_size=32, layers=(0,)), SamplingParams(max_tokens=2, temperature=0)
    source = LLM("tiny", quantization=quant)
    out = save_quantized(source.model, source.engine.model_dir, tmp_path / "q")
    want = [o.token_ids for o in source.generate(["class Stack:"], params, use_tqdm=False)]
    llm = LLM(str(out), attention_backend="triton", num_kv_blocks=16)
    layers = [m for m in llm.engine.model.modules() if isinstance(m, QuantizedLinear)]
    assert layers and all(m.ops.int4_linear is int4_linear_triton for m in layers)
    assert [o.token_ids for o in llm.generate(["class Stack:"], params, use_tqdm=False)] == want


@pytest.mark.parametrize("config, message", [
    (dict(attention_backend="cuda"), "attention_backend must be one of torch, triton, got 'cuda'"),
    (dict(attention_backend="triton", kv_cache="contiguous"), "needs kv_cache='paged', got 'contiguous'"),
    (dict(attention_backend="triton", device="cpu", dtype="bfloat16"), "no bfloat16 arithmetic"),
    (dict(components=Components(paged_decode=lambda *args, **kwargs: None)),
     "components.paged_decode is a Triton kernel's launcher: it runs only with attention_backend='triton'"),
])
def test_attention_backend_is_validated(config, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig.from_knobs(**config)


def test_kernels_benchmark_on_a_cpu_says_it_needs_a_gpu_and_passes_its_smoke_run(tmp_path, capsys):
    import json

    import torch

    from minillm.bench import kernels
    if torch.cuda.is_available():
        pytest.skip("on a GPU the benchmark measures (minutes), this test checks the CPU path")
    figures = kernels.run(quick=True, json_path=str(tmp_path / "kernels.json"))
    out = capsys.readouterr().out
    assert "need a CUDA GPU" in out and "smoke" in out
    assert len(figures["smoke"]) == 7 and all(r["ok"] for r in figures["smoke"])
    assert json.loads((tmp_path / "kernels.json").read_text())["benchmark"] == "kernels"
