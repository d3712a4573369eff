"""Benchmarks are commands, not timed tests: these check the command line every benchmark shares,
the conditions it records, and that the cheapest one still runs (no timing is asserted)."""
import inspect
import json
import os
import subprocess
import sys

import pytest

from minillm.bench import conditions
from minillm.bench.__main__ import EXTRA_OPTIONS, main
from minillm.bench.catalog import BENCHMARKS


@pytest.mark.parametrize("name", list(BENCHMARKS))
def test_every_benchmark_has_the_uniform_run_signature(name):
    """quick, json_path, model first; anything after has a default (the command line passes an extra
    option, bench/__main__.EXTRA_OPTIONS, only to the benchmarks whose run() names it)."""
    params = list(inspect.signature(BENCHMARKS[name].module().run).parameters.values())
    assert [(p.name, p.default) for p in params[:3]] == [("quick", False), ("json_path", None), ("model", None)]
    assert all(p.default is not inspect.Parameter.empty for p in params[3:]), params[3:]


def test_every_extra_option_reaches_some_benchmark():
    taken = {p for b in BENCHMARKS.values() for p in inspect.signature(b.module().run).parameters}
    assert set(EXTRA_OPTIONS) <= taken


def test_list_prints_the_registry_one_name_a_line(capsys):
    assert main(["--list"]) == 0
    assert capsys.readouterr().out.splitlines() == list(BENCHMARKS)


def test_a_benchmark_that_runs_no_model_refuses_model_with_status_2(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["memory", "--model", "tiny"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert "the memory benchmark does not take --model" in err and "no model runs" in err
    assert "Traceback" not in err
    with pytest.raises(ValueError, match="does not take --model"):
        BENCHMARKS["memory"].module().run(quick=True, model="tiny")


@pytest.mark.parametrize("threads", ["0", "-2", "two"])
def test_threads_below_one_are_refused(threads, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["memory", "--threads", threads])
    assert exit_.value.code == 2
    assert f"must be an integer >= 1, got '{threads}'" in capsys.readouterr().err


@pytest.mark.parametrize("load, cpus, threads, busy", [
    (0.2, 2, 2, False),   # an idle machine
    (0.8, 2, 2, True),    # another process holds most of a core this run needs
    (1.2, 2, 1, False),   # it fits on the core this run leaves free
    (1.8, 2, 1, True),    # more than the free core: it takes turns on this run's core
    (3.0, 16, 1, False),  # a large machine with spare cores
    (0.8, 2, 4, True),    # more threads than CPUs leaves no core free
    (None, 2, 1, False),  # no load average on this platform
])
def test_busy_warning_follows_the_load_beyond_the_cores_left_free(load, cpus, threads, busy):
    warning = conditions.busy_warning(load, cpus, threads)
    assert (warning is not None) == busy
    if busy:
        assert "noisy" in warning and "side by side" in warning and f"{load:.2f}" in warning


def test_a_busy_machine_is_warned_about_and_recorded(monkeypatch, capsys):
    monkeypatch.setattr(conditions.os, "getloadavg", lambda: (7.5, 1.0, 1.0))
    record = conditions.check_conditions()
    assert record["load_avg_1min"] == 7.5 and record["busy"] is True
    assert "noisy" in capsys.readouterr().err
    assert "busy" in conditions.machine_line(record)


@pytest.mark.subprocess
def test_memory_quick_run_writes_its_figures_and_conditions(tmp_path):
    path = tmp_path / "memory.json"
    env = {k: v for k, v in os.environ.items() if k != "TQDM_DISABLE"}  # the bars must stay on stderr
    res = subprocess.run([sys.executable, "-m", "minillm.bench", "memory", "--quick", "--threads", "1",
                          "--json", str(path)], capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 0, res.stderr
    assert "KV waste" in res.stdout and "1 torch threads" in res.stdout
    assert "memory: paged, block 16" in res.stderr and "|" not in res.stdout
    figures = json.loads(path.read_text())
    assert figures["benchmark"] == "memory"
    assert figures["conditions"]["torch_threads"] == 1 and "load_avg_1min" in figures["conditions"]
    paged, contiguous = figures["paged, block 16"], figures["contiguous, max_model_len"]
    assert paged["waste"] < 0.04 < contiguous["waste"]
    assert paged["concurrency"] > contiguous["concurrency"]


def test_spec_workloads_are_held_out_code_and_edits_whose_faithful_output_is_in_the_prompt():
    from minillm.bench import spec
    from minillm.models.registry import resolve_model_path
    from minillm.tokenizer import Tokenizer
    tokenizer, sources = Tokenizer(resolve_model_path("tiny")), spec.heldout_sources()
    code = spec.code_prompts(tokenizer, sources, 5, 96)
    assert len(code) == 5 and all(len(p) == 96 for p in code) and len({tuple(p) for p in code}) == 5
    assert all(tokenizer.decode(p).lstrip().startswith(("def ", "class ", "@")) for p in code)
    edits = spec.edit_prompts(tokenizer, sources, 4, (100, 170))
    assert len(edits) == 4
    for prompt, faithful in edits:
        text, body = tokenizer.decode(prompt), tokenizer.decode(faithful)
        assert "_renamed(" in text.splitlines()[-1] and len(faithful) > 40
        assert body.strip() in text  # the output that repeats the function is in the prompt to copy


def test_spec_quick_path_reports_each_proposer_against_theory_and_the_targets(monkeypatch, tmp_path, capsys):
    from minillm.bench import spec
    monkeypatch.setattr(spec, "QUICK", spec.Settings(prompts=1, new_tokens=6, repeats=1, ks=(2,), sampled_k=2,
                                                     batch=2, batch_ks=(2,)))
    figures = spec.run(quick=True, json_path=str(tmp_path / "spec.json"))
    out = capsys.readouterr().out
    assert set(figures["batch1_greedy"]) == {"code", "edit"} and "chat skipped: tiny has no chat template" in out
    for workload in figures["batch1_greedy"]:
        greedy = figures["batch1_greedy"][workload]
        assert {r["proposer"] for r in greedy} >= {"ngram", "draft pico"}
        for r in greedy + figures["batch_2"][workload]:
            assert r["same_tokens"], f"greedy speculation changed the tokens: {r}"
        for r in greedy + figures["batch1_temperature_1"][workload]:
            assert 0 <= r["alpha"] <= 1 and 1 <= r["tokens_per_forward"] <= r["k"] + 1 and r["tokens_per_s"] > 0
    assert "target >= 1.5x" in out and "target >= 1.2x" in out and "best at batch 1 on edit" in out
    assert set(figures["targets"]) == {"edit", "code"}
    record = json.loads((tmp_path / "spec.json").read_text())
    assert record["benchmark"] == "spec" and "torch_threads" in record["conditions"]


def test_quant_quick_path_on_a_hf_checkpoint_skips_group_sizes_that_do_not_divide(monkeypatch, tmp_path, capsys):
    import torch

    from minillm.bench import quant
    from minillm.testing import make_hf_model
    hf = make_hf_model(tmp_path / "model")  # hidden 64, intermediate 96: group size 64 does not divide 96
    monkeypatch.setattr(quant, "QUICK", quant.Settings(
        windows=3, window_tokens=16, group_sizes=(32, 64), fp8=False, prompt_tokens=8, new_tokens=4, repeats=2,
        searched=(("int4", 32),), seeds=(0,), exhaustive=True))
    # random windows: the held-out corpus in this tokenizer's tokens takes longer than the whole test
    monkeypatch.setattr(quant, "heldout_windows", lambda path, count, tokens: torch.randint(
        1, 300, (count, tokens + 1), generator=torch.Generator().manual_seed(0)))
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # as `--threads 2` would: --quick decodes at the run's thread count
    try:
        figures = quant.run(quick=True, json_path=str(tmp_path / "quant.json"), model=str(tmp_path / "model"))
    finally:
        torch.set_num_threads(before)
    out = capsys.readouterr().out
    assert list(figures["decode_tokens_per_s"]) == [min(2, os.cpu_count() or 1)]
    assert "int4-g64 skipped: group size 64 does not divide intermediate_size 96" in out
    assert [r["scheme"] for r in figures["schemes"] if not r["scheme"].startswith("llama.cpp")] == [
        "full", "int8", "int4-g32", "int4-g32-minmax", "int8+head", "int4-g32-minmax+head", "int8 reference",
        "int4-g32 reference"]
    shapes = [p.shape for name, p in hf.named_parameters() if "layers" in name and name.endswith("proj.weight")]
    assert figures["bytes"]["int8"]["quantized"] == sum(o * i + 4 * o for o, i in shapes)  # codes + a scale a row
    assert figures["bytes"]["int4-g32"]["quantized"] == sum(o * i // 2 + o * (i // 32) * 5 for o, i in shapes)
    assert figures["bytes"]["full"]["quantized"] == 0
    [study] = figures["sensitivity"]
    assert study["scheme"] == "int4-g32" and study["exhaustive"] and study["sets_measured"] == 3
    assert study["nll_pairs"] == 5  # the full model joins as the empty set: three more pairs
    assert study["pairs"] == 2 and set(study["projections_alone"]) == {"q_proj", "k_proj", "v_proj", "o_proj",
                                                                        "gate_proj", "up_proj", "down_proj"}
    assert "cancellation at int4-g32:" in out and "48 tokens scored per measurement" in out
    record = json.loads((tmp_path / "quant.json").read_text())
    assert record["benchmark"] == "quant" and "torch_threads" in record["conditions"]
    assert all(len(r) == 2 for by in record["decode_tokens_per_s"].values() for r in by.values())
    assert {r["scheme"] for r in record["kernels"]} == {"int8", "int4-g32"}


def test_throughput_quick_path_compares_policies_at_each_batch_and_profiles_a_full_step(monkeypatch, tmp_path, capsys):
    from minillm.bench import throughput
    from minillm.testing import make_hf_model
    make_hf_model(tmp_path / "model", max_position_embeddings=512)  # the workload's prompts reach 320 tokens
    monkeypatch.setattr(throughput, "QUICK", throughput.Sweep(requests=8, batch_sizes=(2, 4), max_output=12,
                                                              median_output=6))
    figures = throughput.run(quick=True, json_path=str(tmp_path / "throughput.json"), model=str(tmp_path / "model"))
    out = capsys.readouterr().out
    assert [r["batch"] for r in figures["sweep"]] == [2, 4] and figures["requests"] == 8
    for r in figures["sweep"]:
        assert r["continuous / static"] == r["continuous tok/s"] / r["static tok/s"] > 0
    assert figures["outputs_identical_across_policies"]
    assert set(figures["tokens_per_s"]) == {"continuous, batch 2", "static, batch 2", "continuous, batch 4",
                                            "static, batch 4", "transformers, batch 4"}
    step = figures["batched_decode_step_ms"]  # the profiled run's full decode steps, phase by phase
    assert {"schedule", "prepare", "model", "attention", "sample"} <= set(step)
    assert 0 < step["attention"] < step["model"]
    assert "one decode step of 4 sequences" in out and "continuous never slower than static:" in out
    record = json.loads((tmp_path / "throughput.json").read_text())
    assert record["benchmark"] == "throughput" and "torch_threads" in record["conditions"]


def test_profile_quick_run_writes_a_profile_that_loads_with_its_curve_and_spread(tmp_path, capsys):
    from minillm.sim import StepProfile
    figures = BENCHMARKS["profile"].module().run(quick=True, json_path=str(tmp_path / "profile.json"))
    loaded = StepProfile.load(tmp_path / "profile.json")
    assert loaded.token_curve and loaded.fixed > 0
    assert len(loaded.spread) == 64 and list(loaded.spread) == sorted(loaded.spread)
    assert loaded.spread[0] < 1 < loaded.spread[-1]  # real steps stray both ways from a fitted price
    assert loaded.step_time(5, 3, 200) == StepProfile(**figures["profile"]).step_time(5, 3, 200)
    assert "how far the steps strayed from that price" in capsys.readouterr().out


def test_batching_bound_is_amdahls_law_over_a_sequential_runs_own_prefill_and_decode_times():
    from minillm.bench.synthetic_traffic import chat_workload
    from minillm.bench.throughput import batching_bound, make_prompts, run_minillm
    timings = [{"queue_time": 0.0, "ttft": 1.0, "e2e": 4.0}, {"queue_time": 4.0, "ttft": 5.0, "e2e": 8.0}]
    share, bound = batching_bound(timings, decode_speedup=8.0)   # prefill 1 + 1 of busy 4 + 4
    assert share == 0.25 and bound == pytest.approx(1 / (0.25 + 0.75 / 8))
    assert batching_bound(timings, decode_speedup=1.0)[1] == 1   # decode no cheaper batched: nothing to gain
    workload = chat_workload(3, seed=0, max_output=8, median_output=4, max_prompt=24, median_prompt=12)
    metrics = []
    run_minillm("tiny", make_prompts(workload, 4096), workload, metrics=metrics, scheduler="sequential")
    assert len(metrics) == 3 and all(0 < m["ttft"] - m["queue_time"] < m["e2e"] - m["queue_time"] for m in metrics)
    assert 0 < batching_bound(metrics, 8.0)[0] < 1


def test_drain_share_is_the_run_after_its_last_admission():
    from minillm.bench.synthetic_traffic import chat_workload
    from minillm.bench.throughput import drain_share, make_prompts, run_minillm
    # every request there at 0: the last admitted at 3 s of a run that ended at 4 s
    timings = [{"queue_time": 0.0, "e2e": 2.0}, {"queue_time": 3.0, "e2e": 4.0}, {"queue_time": 1.0, "e2e": 3.5}]
    assert drain_share(timings) == pytest.approx(0.25)
    workload = chat_workload(5, seed=0, max_output=12, median_output=6, max_prompt=24, median_prompt=12)
    metrics = []
    run_minillm("tiny", make_prompts(workload, 4096), workload, metrics=metrics, scheduler="continuous",
                max_num_seqs=2)
    assert 0 < drain_share(metrics) < 1  # five requests two at a time: the last waits, then the batch drains


def test_policy_model_charges_each_policy_its_steps():
    from minillm.bench.synthetic_traffic import Request, chat_workload
    from minillm.bench.throughput import policy_model
    # A: prompt 2, 3 tokens out; B: 1, 1; C: 1, 2. Static by 2: [A, B] prefill 3 ms, A alone two steps (10 each);
    # then [C]: 1 ms and one step. Continuous: A and B join (3 ms), C takes B's slot beside A (10 + 1), then one
    # step of both (16).
    workload = [Request(2, 3, 8), Request(1, 1, 8), Request(1, 2, 8)]
    assert policy_model(workload, {1: 10.0, 2: 16.0}, 1.0, 2) == (34.0, 30.0)
    assert policy_model(workload, {1: 10.0, 4: 40.0}, 0.0, 2)[1] == 10.0 + 20.0  # a step of 2: between 1 and 4
    # one size measured: every step costs it (memory-bound decode). Continuous: A and B (3), C beside A (10 + 1),
    # both (10); static as above but with A's two steps and C's at 10
    assert policy_model(workload, {1: 10.0}, 1.0, 2) == (34.0, 24.0)
    workload = chat_workload(20, seed=3, max_output=30, median_output=8, max_prompt=40, median_prompt=10)
    steps = {1: 30.0, 4: 33.0, 16: 60.0}
    static, continuous = policy_model(workload, steps, 0.5, 1)
    assert static == pytest.approx(continuous)  # one at a time, the two policies are the same
    static, continuous = policy_model(workload, steps, 0.5, 4)
    assert continuous < static
    static, continuous = policy_model(workload, steps, 0.5, 20)  # every request in one group: nothing to refill
    assert static == pytest.approx(continuous)
