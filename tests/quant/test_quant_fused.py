"""The fused CPU path of the quantized linear (quant/fused.py) against the plain-PyTorch reference and
PyTorch's F.linear in float64, the dispatch between them, and the min-max int4 codec against
llama.cpp's Q4_1 as the gguf package writes and reads it."""
import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType, quants

from minillm import LLM, SamplingParams
from minillm.models.registry import resolve_model_path
from minillm.quant import QuantConfig, QuantizedLinear, QuantOps, codecs, fused, quantize_model, save_quantized
from minillm.quant.quantized_linear import int4_linear, scaled_linear

needs_fused = pytest.mark.skipif(not fused.available(), reason="no C++ compiler: the fused kernels do not exist here")
# (out, in, group size): odd row counts, inputs past the last whole vector of 16 or 32, one group or many, groups
# of whole vectors (32, 64) and of not (6, 16: the scalar loop)
INT4_SHAPES = [(7, 96, 32), (33, 64, 16), (5, 18, 6), (97, 576, 64), (961, 576, 32), (3, 1536, 64)]
INT8_SHAPES = [(7, 96), (33, 65), (5, 17), (961, 576), (3, 1536)]
ROWS = [1, 2, 5, 16]


def signed(seed: int, *shape: int) -> torch.Tensor:
    """Both signs, with a one-signed half row at each end (groups of only positive or only negative weights)."""
    w = torch.randn(*shape, generator=torch.Generator().manual_seed(seed))
    if w.dim() == 2:
        w[0, : shape[1] // 2] = w[0, : shape[1] // 2].abs()
        w[-1, : shape[1] // 2] = -w[-1, : shape[1] // 2].abs()
    return w


def close(got: torch.Tensor, want: torch.Tensor, k: int) -> None:
    """Within float32 rounding of a k-term sum: a few ulps of the sum of |terms|, not of the result."""
    assert got.shape == want.shape and got.dtype == torch.float32
    err = (got.double() - want.double()).abs().max().item()
    assert err <= 1e-6 * k ** 0.5 * (want.abs().max().item() + 1), f"off by {err:.3g}"


@needs_fused
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("n, k", INT8_SHAPES)
def test_fused_int8_equals_the_reference_and_float64(n, k, rows):
    w, x, bias = signed(n + k, n, k) * 0.05, signed(rows, rows, k), signed(1, n)
    q, scale = codecs.quantize_int8(w)
    got = fused.int8_linear(x, q, scale, bias)
    close(got, scaled_linear(x, q, scale, bias), k)
    close(got, F.linear(x.double(), codecs.dequantize_int8(q, scale).double(), bias.double()).float(), k)
    close(fused.int8_linear(x, q, scale, None), scaled_linear(x, q, scale, None), k)


@needs_fused
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("int4_range", ["holds-zero", "min-max"])
@pytest.mark.parametrize("n, k, group_size", INT4_SHAPES)
def test_fused_int4_equals_the_reference_and_float64(n, k, group_size, int4_range, rows):
    w, x, bias = signed(n + k, n, k) * 0.05, signed(rows, rows, k), signed(2, n)
    quantize = codecs.quantize_int4 if int4_range == "holds-zero" else codecs.quantize_int4_minmax
    codes, scale, zero = quantize(w, group_size)
    packed = codecs.pack_int4(codes)
    got = fused.int4_linear(x, packed, scale, zero, bias)
    close(got, int4_linear(x, packed, scale, zero, bias), k)
    weight = codecs.dequantize_int4(codes.double(), scale.double(), zero.double())
    close(got, F.linear(x.double(), weight, bias.double()).float(), k)
    close(fused.int4_linear(x[None], packed, scale, zero, None)[0], int4_linear(x, packed, scale, zero, None), k)


@needs_fused
def test_fused_int4_refuses_an_odd_group_size():
    codes, scale, zero = codecs.quantize_int4(signed(0, 4, 15), 5)
    with pytest.raises(ValueError, match="even group size"):
        fused.int4_linear(torch.randn(1, 15), codecs.pack_int4(codes), scale, zero, None)


def calls(monkeypatch, name: str) -> list:
    seen, real = [], getattr(fused, name)
    monkeypatch.setattr(fused, name, lambda *a: seen.append(a[0].shape) or real(*a))
    return seen


@needs_fused
@pytest.mark.parametrize("scheme, name", [("int8", "int8_linear"), ("int4", "int4_linear")])
def test_quantized_linear_takes_the_fused_kernel_for_a_few_rows_and_the_reference_when_asked(monkeypatch, scheme,
                                                                                           name):
    w, seen = signed(3, 33, 128), calls(monkeypatch, name)
    fast = QuantizedLinear.from_weight(w, None, scheme, 32)
    plain = QuantizedLinear.from_weight(w, None, scheme, 32, kernel="reference")
    for rows in (1, fused.MAX_ROWS, fused.MAX_ROWS + 1):
        x = signed(rows, rows, 128)
        close(fast(x), plain(x), 128)
    assert seen == [(1, 128), (fused.MAX_ROWS, 128)]  # the reference's call and 17 rows never reach it
    assert "kernel=reference" in repr(plain)


@needs_fused
def test_an_odd_group_size_and_a_non_float32_input_take_the_reference(monkeypatch):
    seen = calls(monkeypatch, "int4_linear")
    layer = QuantizedLinear.from_weight(signed(4, 9, 15), None, "int4", 5)
    x = signed(5, 1, 15)
    assert torch.allclose(layer(x), F.linear(x, layer.dequantized_weight()), atol=1e-5)
    assert layer(x.double()).dtype == torch.float64
    assert seen == []


def test_a_plugged_int4_linear_replaces_the_fused_kernel():
    seen = []
    ops = QuantOps(int4_linear=lambda *a: seen.append(1) or int4_linear(*a))
    layer = QuantizedLinear.from_weight(signed(6, 8, 64), None, "int4", 32, ops=ops)
    layer(torch.randn(1, 64))
    assert seen == [1]


def q4_1_weights(rows: int, cols: int, seed: int) -> torch.Tensor:
    """Weights as a Q4_1 GGUF stores them: quantized and dequantized by the gguf package (llama.cpp's format)."""
    w = signed(seed, rows, cols).numpy().astype(np.float32)
    w[0, :32] += 3.0  # a block far from 0: Q4_1's free minimum holds it, a range that must hold 0 does not
    blocks = quants.quantize(w, GGMLQuantizationType.Q4_1)
    return torch.from_numpy(np.ascontiguousarray(quants.dequantize(blocks, GGMLQuantizationType.Q4_1)))


def test_min_max_int4_at_32_gives_back_q4_1_weights_where_holding_zero_does_not():
    w = q4_1_weights(16, 256, 7)
    back = codecs.dequantize_int4(*codecs.quantize_int4_minmax(w, 32))
    assert (back - w).abs().max() <= 1e-6 * w.abs().max()
    holds_zero = codecs.dequantize_int4(*codecs.quantize_int4(w, 32))
    assert (holds_zero - w).abs().mean() > 100 * (back - w).abs().mean()


@pytest.mark.parametrize("group_size", [16, 32, 64])
def test_min_max_int4_round_trip_is_within_half_a_step_and_spans_each_group(group_size):
    w = signed(8, 33, 192) + 0.5  # mostly positive: one-signed groups
    codes, scale, zero = codecs.quantize_int4_minmax(w, group_size)
    assert codes.dtype == torch.uint8 and zero.dtype == torch.float32 and scale.shape == (33, 192 // group_size)
    groups = codes.reshape(33, -1, group_size)
    assert (groups.amin(-1) == 0).all() and (groups.amax(-1) == 15).all()  # every level inside the group
    step = scale.repeat_interleave(group_size, dim=1)
    assert ((w - codecs.dequantize_int4(codes, scale, zero)).abs() <= step / 2 * (1 + 1e-4)).all()


def test_int4_range_and_kernel_are_validated_and_labelled():
    assert QuantConfig("int4", group_size=32, int4_range="min-max").label() == "int4-g32-minmax"
    assert QuantConfig("int8", kernel="reference").label() == "int8 reference"
    with pytest.raises(ValueError, match="int4_range must be one of holds-zero, min-max, got 'minmax'"):
        QuantConfig("int4", int4_range="minmax")
    with pytest.raises(ValueError, match="applies to int4 only"):
        QuantConfig("int8", int4_range="min-max")
    with pytest.raises(ValueError, match="kernel must be one of fused, reference, got 'aten'"):
        QuantConfig("int8", kernel="aten")
    config = QuantConfig("int4", group_size=32, int4_range="min-max", kernel="reference")
    assert QuantConfig.from_dict(config.to_dict()) == config


def test_a_min_max_checkpoint_loads_back_with_its_float_zero_points(tmp_path):
    config = QuantConfig("int4", group_size=32, int4_range="min-max")
    llm = LLM("tiny", quantization=config)
    ids = torch.arange(1, 41)
    save_quantized(llm.engine.model, resolve_model_path("tiny"), tmp_path / "q")
    loaded = LLM(str(tmp_path / "q"))
    assert loaded.engine.model.model.layers[0].mlp.down_proj.zero.dtype == torch.float32
    assert torch.equal(loaded.logits(ids), llm.logits(ids))


@pytest.mark.parametrize("config", [QuantConfig("int8"), QuantConfig("int4", group_size=64),
                                    QuantConfig("int4", group_size=32, int4_range="min-max")])
def test_the_engine_decodes_the_same_tokens_with_the_fused_kernels_as_with_the_reference(config):
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    prompt = [[5, 17, 301, 42, 7]]
    fast = LLM("tiny", quantization=config).generate(prompt, params, use_tqdm=False)[0].token_ids
    plain = LLM("tiny", quantization=dataclasses.replace(config, kernel="reference"))
    assert fast == plain.generate(prompt, params, use_tqdm=False)[0].token_ids


def test_quantize_model_gives_each_layer_the_configs_range_and_kernel():
    model = LLM("tiny").engine.model
    quantize_model(model, QuantConfig("int4", group_size=32, int4_range="min-max", kernel="reference"))
    layer = model.model.layers[1].self_attn.qkv_proj
    assert (layer.int4_range, layer.kernel, layer.zero.dtype) == ("min-max", "reference", torch.float32)
