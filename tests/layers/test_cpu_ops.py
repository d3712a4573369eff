"""The layers' fused CPU operators (layers/cpu_ops.cpp) against the PyTorch formulas they replace: the residual
add with RMSNorm, rotary embeddings in place on a view of the qkv product, SiLU-and-multiply; odd widths (the
scalar tails), both signs and large magnitudes, many rows on two threads (the parallel path); the layers choose
them only where they apply; and the engine's greedy tokens and logits are those of the plain-PyTorch layers."""
import pytest
import torch
import torch.nn.functional as F

from minillm import LLM, SamplingParams
from minillm.layers import cpu_ops
from minillm.layers.mlp import SwiGLUMLP
from minillm.layers.rmsnorm import RMSNorm
from minillm.layers.rotary import RotaryEmbedding

pytestmark = pytest.mark.skipif(cpu_ops.library() is None, reason="no C++ compiler: the layers run PyTorch only")

SHAPES = [(1, 576), (3, 13), (5, 8), (2, 1), (300, 576)]  # 300 x 576 floats: shared among threads


@pytest.fixture(params=[1, 2], ids=["1 thread", "2 threads"])
def threads(request):
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


def signed(*shape, scale=3.0, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


@pytest.mark.parametrize("rows, n", SHAPES)
@torch.inference_mode()
def test_add_rms_norm_equals_the_torch_formula_and_updates_the_stream_in_place(rows, n, threads):
    x, stream, weight = signed(rows, n), signed(rows, n, seed=1), signed(n, seed=2)
    expected_stream = x + stream
    expected = F.rms_norm(expected_stream, (n,), weight, 1e-5)
    y, h = cpu_ops.rms_norm(x, weight, 1e-5, stream)
    assert h is stream and torch.equal(stream, expected_stream)
    torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(cpu_ops.rms_norm(x, weight, 1e-5), F.rms_norm(x, (n,), weight, 1e-5),
                               rtol=1e-5, atol=1e-6)


@torch.inference_mode()
def test_rms_norm_reads_rows_apart_and_takes_eps_as_given():
    wide = signed(4, 40)
    x, weight = wide[:, 3:24], signed(21, seed=3)  # rows 40 floats apart
    tiny = x * 1e-4                                 # eps dominates mean(x^2) here: a wrong eps shows
    for eps in (1e-6, 1e-2):
        torch.testing.assert_close(cpu_ops.rms_norm(tiny, weight, eps), F.rms_norm(tiny, (21,), weight, eps),
                                   rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(cpu_ops.rms_norm(x, weight, 1e-6), F.rms_norm(x, (21,), weight, 1e-6))


@torch.inference_mode()
def test_a_residual_of_another_shape_or_layout_is_refused():
    x, weight = signed(2, 8), signed(8)
    with pytest.raises(ValueError, match=r"contiguous and shaped like x \(2, 8\), got \(2, 4\)"):
        cpu_ops.rms_norm(x, weight, 1e-5, signed(2, 4))
    with pytest.raises(ValueError, match="contiguous"):
        cpu_ops.rms_norm(x, weight, 1e-5, signed(8, 2).t())


@pytest.mark.parametrize("rows, heads, d", [(1, 13, 64), (3, 5, 8), (2, 3, 6), (300, 4, 64)])
@torch.inference_mode()
def test_rotary_rotates_a_view_of_the_qkv_product_in_place(rows, heads, d, threads):
    rotary = RotaryEmbedding(d, 4096)
    positions = torch.randint(0, 4096, (rows,), generator=torch.Generator().manual_seed(4))
    qkv = signed(rows, (heads + 2) * d)
    heads_view = qkv[:, :heads * d].view(rows, heads, d)  # rows (heads + 2) * d apart, as the model's q/k
    cos, sin = rotary.cos[positions][:, None], rotary.sin[positions][:, None]
    first, second = heads_view[..., :d // 2], heads_view[..., d // 2:]
    expected = heads_view * cos + torch.cat([-second, first], dim=-1) * sin  # the rotate-half formula
    untouched = qkv[:, heads * d:].clone()
    out = rotary(positions, heads_view)
    assert out.data_ptr() == qkv.data_ptr()  # in place
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(qkv[:, heads * d:], untouched)


@pytest.mark.parametrize("rows, inter", [(1, 1536), (3, 13), (2, 7), (300, 256)])
@torch.inference_mode()
def test_silu_mul_equals_the_torch_formula_from_deep_negatives_to_large_positives(rows, inter, threads):
    gate_up = signed(rows, 2 * inter, scale=8.0)
    gate_up[0, :5] = torch.tensor([-200.0, -90.0, 0.0, 60.0, 1e-30])[:min(5, inter)]
    expected = F.silu(gate_up[:, :inter]) * gate_up[:, inter:]
    torch.testing.assert_close(cpu_ops.silu_mul(gate_up), expected, rtol=1e-5, atol=1e-6)


def test_the_layers_take_the_fused_path_only_where_it_applies():
    norm, x = RMSNorm(16), signed(3, 16)
    torch.nn.init.normal_(norm.weight)
    with torch.inference_mode():
        assert cpu_ops.applies(x)
        assert not cpu_ops.applies(x.bfloat16()) and not cpu_ops.applies(signed(16, 3).t())
        stream = signed(3, 16, seed=5)
        fused, fused_stream = norm(x, stream.clone())
    assert not cpu_ops.applies(x)                          # autograd on: the PyTorch formulas run
    reference, reference_stream = norm(x, stream)            # (with autograd: the torch path)
    assert reference.requires_grad and torch.equal(stream, signed(3, 16, seed=5))  # not in place there
    torch.testing.assert_close(fused, reference.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(fused_stream, reference_stream)
    mlp = SwiGLUMLP(16, 24)
    with torch.inference_mode():
        out = mlp(x)
    torch.testing.assert_close(out, mlp(x).detach(), rtol=1e-5, atol=1e-6)


def test_the_engine_makes_the_same_tokens_and_logits_as_with_the_plain_torch_layers(monkeypatch):
    prompts = ["def fib(n):", "import os\n", "class Stack:\n    def push(self, x):"]
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    fused = LLM("tiny")
    ids = fused.tokenizer.encode(prompts[0])
    tokens, logits = [o.token_ids for o in fused.generate(prompts, params, use_tqdm=False)], fused.logits(ids)
    monkeypatch.setattr(cpu_ops, "applies", lambda x: False)
    plain = LLM("tiny")
    assert [o.token_ids for o in plain.generate(prompts, params, use_tqdm=False)] == tokens
    torch.testing.assert_close(plain.logits(ids), logits, rtol=1e-4, atol=1e-4)
