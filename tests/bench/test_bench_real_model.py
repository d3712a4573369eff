"""Every benchmark that runs a model, on the real one (SmolLM2-135M-Instruct): its quick path runs in
process, on the smaller quick workload a big model gets, and writes figures that are present and sane.
No timing is asserted beyond "positive"; greedy outputs must be identical where a benchmark checks them.
Skipped when the model's package is not installed.

The spec, quant, throughput and cluster benchmarks run here on a workload smaller still (`smaller`): every part of
them runs, on fewer prompts, tokens and requests. Their quick run on SmolLM2 is what the README records, and took
85-120 s each on a 2-core machine, a fifth of the suite's time on one worker; these tests check code paths, not
figures."""
import dataclasses
import json
import math

import pytest
import torch

from minillm.bench.catalog import BENCHMARKS
from minillm.models import registry

pytestmark = [pytest.mark.slow, pytest.mark.real_model]  # the real model, in every benchmark that runs one

NAME = "smollm2-135m-instruct"
if registry.packaged_gguf(NAME) is None:
    pytest.skip(f"the real model is not installed: {registry.PACKAGED_MODELS[NAME].install_command()}",
                allow_module_level=True)


@pytest.fixture(scope="module", autouse=True)
def cache(real_model_cache):
    """The model from the run's shared conversion cache, which the processes the
    benchmarks start (servers, replicas, workers) find through the environment too; one torch thread,
    as `--threads 1` gives (on a busy 2-core machine, two threads spin-wait for each other)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MINILLM_CACHE", str(real_model_cache))
        registry.resolve_model_path(NAME)
        yield
    torch.set_num_threads(threads)


def smaller(monkeypatch, name: str, **changes) -> None:
    """The benchmark's --quick workload for a big model (its module's QUICK_BIG...) made smaller for this test:
    changes name a field of its QUICK_BIG settings, or another module constant in upper case."""
    module = BENCHMARKS[name].module()
    for key, value in changes.items():
        if key.isupper():
            monkeypatch.setattr(module, key, value)
        else:
            monkeypatch.setattr(module, "QUICK_BIG", dataclasses.replace(module.QUICK_BIG, **{key: value}))


def quick_run(name: str, tmp_path) -> tuple[dict, dict]:
    """-> (what run() returned, the JSON it wrote)."""
    path = tmp_path / f"{name}.json"
    figures = BENCHMARKS[name].module().run(quick=True, json_path=str(path), model=NAME)
    record = json.loads(path.read_text())
    assert record["benchmark"] == name and "torch_threads" in record["conditions"]
    return figures, record


# Not yet smoke-tested on the real model, and why (the list must shrink, never hide a benchmark).
NOT_YET: dict[str, str] = {}


def test_every_benchmark_that_runs_a_model_is_covered_here():
    covered = {name.removeprefix("test_").split("_")[0] for name in globals() if name.startswith("test_")}
    assert {b.name for b in BENCHMARKS.values() if b.takes_model} == (covered - {"every"}) | set(NOT_YET)


def test_decode_streams_the_real_weights_and_matches_transformers(tmp_path, capsys):
    figures, _ = quick_run("decode", tmp_path)
    assert figures["smaller_quick_workload"] and "a smaller quick workload" in capsys.readouterr().out
    assert figures["model"].startswith(f"{NAME}, 134.5M parameters")
    for key in ("minillm", "bare_loop", "transformers", "no_cache"):
        assert figures[f"{key}_tokens_per_s"] > 0
    assert figures["greedy_tokens_identical"]
    assert figures["cache_vs_recompute"] > 1 and all(c["speedup"] > 1 for c in figures["per_context"])
    assert figures["achieved_bandwidth_GBps"] > 0 and figures["step_breakdown_ms"]["model forward + logits"] > 0


def test_prefix_caching_skips_the_shared_prompt_with_identical_outputs(tmp_path):
    figures, _ = quick_run("prefix", tmp_path)
    assert figures["outputs_identical"] and 0 < figures["hit_rate"] < 1
    assert figures["computed_tokens_on"] < figures["computed_tokens_off"]
    assert figures["ttft_ms_on"] > 0 and figures["ttft_ms_off"] > 0


def test_chunked_prefill_runs_both_variants_with_identical_outputs(tmp_path):
    figures, _ = quick_run("chunked", tmp_path)
    assert figures["outputs_identical"]
    for variant in ("unchunked", "chunked (budget 64)"):
        assert figures[variant]["tokens_per_s"] > 0 and 0 < figures[variant]["itl_p50_ms"] <= figures[variant][
            "itl_p99_ms"]


def test_spec_runs_prompt_lookup_the_bundled_speculator_and_a_self_draft_and_says_no_bundled_draft_fits(
        tmp_path, capsys, monkeypatch):
    smaller(monkeypatch, "spec", prompts=1, new_tokens=12, ks=(4,), batch=2, code_tokens=64)
    figures, _ = quick_run("spec", tmp_path)
    out = capsys.readouterr().out
    assert "draft pico skipped: draft model 'pico' has a vocabulary of" in out
    assert f"no bundled draft shares {NAME}'s tokenizer" in out
    batch = f"batch_{figures['settings']['batch']}"
    assert set(figures["targets"]) == {"edit", "code", "chat"}
    for workload in ("code", "edit", "chat"):
        greedy = figures["batch1_greedy"][workload]
        assert {r["proposer"] for r in greedy} == {"ngram", "mlp", "draft self-int4-g32-minmax, int8 head"}
        for r in greedy + figures[batch][workload]:
            assert r["same_tokens"], f"greedy speculation changed the tokens: {r}"
        for r in greedy + figures["batch1_temperature_1"][workload]:
            assert 0 <= r["alpha"] <= 1 and 1 <= r["tokens_per_forward"] <= r["k"] + 1 and r["tokens_per_s"] > 0


def test_throughput_policies_agree_on_the_tokens(tmp_path, monkeypatch):
    smaller(monkeypatch, "throughput", requests=6, batch_sizes=(3,), max_output=24)
    figures, _ = quick_run("throughput", tmp_path)
    assert figures["smaller_quick_workload"] and figures["outputs_identical_across_policies"]
    assert all(v > 0 for v in figures["tokens_per_s"].values())
    assert all(r["continuous / static"] > 0 for r in figures["sweep"])
    assert 0 < figures["batched_decode_step_ms"]["attention"] < figures["batched_decode_step_ms"]["model"]


def test_quant_scores_each_scheme_on_the_real_weights(tmp_path, monkeypatch):
    smaller(monkeypatch, "quant", new_tokens=4, kernel_rows=(1,), kernel_repeats=1)
    figures, _ = quick_run("quant", tmp_path)
    assert [r["scheme"] for r in figures["schemes"] if not r["scheme"].startswith("llama.cpp")] == [
        "full", "int8", "int4-g64", "int4-g64-minmax", "int8+head", "int4-g64-minmax+head", "int8 reference",
        "int4-g64 reference"]
    quality, size = figures["quality"], figures["bytes"]
    assert all(1 < q["perplexity"] < math.inf for q in quality.values())
    assert quality["full"]["kl"] == 0 and quality["int8"]["top1"] > 0.9
    assert 0 < size["int4-g64"]["quantized"] < size["int8"]["quantized"] < size["int8"]["quantized_fp32"]
    assert all(r > 0 for by in figures["decode_tokens_per_s"].values() for rates in by.values() for r in rates)
    [study] = figures["sensitivity"]
    assert len(study["layers_alone"]) == 30 and study["sets_measured"] > 30


def test_cluster_validates_routes_splits_and_shards_the_real_model(tmp_path, monkeypatch):
    """Every part of the cluster benchmark runs on the real model: the simulator against real runs (one
    replica and two in processes), routing on a real fleet, disaggregation, and tensor parallelism at 3 ranks
    (SmolLM2's 9 query and 3 KV heads do not split in 2)."""
    smaller(monkeypatch, "cluster", QUICK_BIG=4, QUICK_BIG_DECODE=32, QUICK_BIG_ROUTERS=("prefix_aware",))
    figures, _ = quick_run("cluster", tmp_path)
    assert figures["smaller_quick_workload"] and figures["profile"]["source"].startswith(NAME)
    real = [r for r in figures["validation"] if r["real"] != "-"]
    assert {r["load"] for r in real} == {"heavy", "2 replicas"} and all(r["real"] > 0 and r["simulated"] > 0
                                                                          for r in real)
    for name, policy in figures["routing_real"]["policies"].items():
        assert policy["completed"] > 0 and policy["failed"] == 0, name
    disagg = figures["disaggregation"]
    assert disagg["colocated"]["itl_decode_p50_ms"] > 0 and disagg["disaggregated"]["ttft_long_p50_ms"] > 0
    assert all(b > 0 for b in disagg["kv_bytes_per_request"].values())
    tp = figures["tensor_parallel"]
    assert tp["tp"] == 3 and tp["greedy_tokens_equal"]
    assert tp["bytes_per_token_measured"] == tp["bytes_per_token_formula"] == 2 * 30 * 576 * 4
    assert figures["capacity_plan"]["replicas"] >= 1


def test_agents_keep_recompute_and_offload_all_serve_every_call(tmp_path):
    figures, _ = quick_run("agents", tmp_path)
    variants = figures["variants"]
    assert set(variants) == {"keep-in-pool", "recompute", "offload"}
    assert len({v["calls"] for v in variants.values()}) == 1
    assert all(v["ttft_median_ms"] > 0 for v in variants.values())
    assert variants["keep-in-pool"]["hit_rate"] > 0 and variants["offload"]["bytes_moved"] > 0


def test_kernels_accepts_the_real_model(tmp_path):
    figures, _ = quick_run("kernels", tmp_path)
    assert figures["model"] == NAME
    if figures["device"] == "cpu":
        assert all(r["ok"] for r in figures["smoke"])
    else:
        assert figures["end_to_end"]["same_tokens"] and figures["end_to_end"]["triton_tokens_per_s"] > 0


def test_serve_completes_every_request_on_each_scheduler(tmp_path):
    figures, _ = quick_run("serve", tmp_path)
    n = figures["workload"]["n"]
    assert figures["smaller_quick_workload"] and figures["capacity_rps"] > 0
    for name, s in figures["schedulers"].items():
        assert s["completed"] == n and s["failed"] == 0 and s["output_throughput"] > 0, name
    assert all(p["completed"] == n for p in figures["sweep"])


def test_profile_of_the_real_model_loads_for_the_simulator(tmp_path):
    from minillm.sim import StepProfile
    figures, _ = quick_run("profile", tmp_path)
    loaded = StepProfile.load(tmp_path / "profile.json")
    assert loaded.fixed > 0 and loaded.token_curve
    assert loaded.step_time(5, 3, 200) == StepProfile(**figures["profile"]).step_time(5, 3, 200)
