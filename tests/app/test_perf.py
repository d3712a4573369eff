"""minillm.perf: the roofline arithmetic and the hardware profiles."""
import pytest

from minillm.perf import (
    PROFILES,
    bound,
    decode_cost,
    measure_machine,
    model_shape,
    param_count,
    predicted_time,
    prefill_cost,
)


def test_param_count_matches_the_published_size():
    assert param_count(model_shape("SmolLM2-135M")) == pytest.approx(134.5e6, rel=0.01)
    assert param_count(model_shape("Llama-3.1-8B")) == pytest.approx(7.5e9, rel=0.01)  # 8.0B with embeddings


def test_single_sequence_decode_does_about_one_flop_per_bf16_byte():
    cost = decode_cost(model_shape("Llama-3.1-8B"), batch=1, context=1, dtype="bfloat16")
    assert cost.intensity == pytest.approx(1.0, rel=0.01)  # 2 FLOPs per weight, 2 bytes per weight


def test_batching_decode_raises_intensity_and_prefill_is_compute_bound():
    cfg, h100 = model_shape("Llama-3.1-8B"), PROFILES["H100 SXM"]
    one, many = (decode_cost(cfg, b, 512, "bfloat16") for b in (1, 64))
    assert many.intensity > 30 * one.intensity
    assert bound(h100, one, "bfloat16") == "memory"
    assert bound(h100, prefill_cost(cfg, 1, 2048, "bfloat16"), "bfloat16") == "compute"


def test_memory_bound_decode_time_is_bytes_over_bandwidth():
    cfg, h200 = model_shape("Llama-3.1-70B"), PROFILES["H200 SXM"]
    cost = decode_cost(cfg, 1, 1, "bfloat16")
    assert predicted_time(h200, cost, "bfloat16") == pytest.approx(cost.bytes / 4.8e12)


def test_profiles_have_their_published_ridges():
    assert PROFILES["H100 SXM"].ridge["bfloat16"] == pytest.approx(295, rel=0.01)
    assert PROFILES["A100 SXM 80GB"].ridge["bfloat16"] == pytest.approx(153, rel=0.01)
    assert PROFILES["Groq LPU (SRAM)"].peak("bfloat16") == PROFILES["Groq LPU (SRAM)"].peak_flops["float16"]


def test_bad_sizes_and_dtypes_are_refused_with_the_value():
    with pytest.raises(ValueError, match="batch 0"):
        decode_cost(model_shape("pico"), 0, 10, "float32")
    with pytest.raises(ValueError, match="'fp8'"):
        prefill_cost(model_shape("pico"), 1, 10, "fp8")


def test_this_machine_is_measured():
    hw = measure_machine("cpu")
    assert hw.bandwidth > 1e8 and hw.peak("float32") > 1e8
