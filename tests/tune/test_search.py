import json

import pytest

from minillm.tune import TuneError, search, tune

SPACE = {"max_num_seqs": [2, 8], "enable_prefix_caching": [True, False]}


def run(trace, results, profiles, **options):
    return tune("tiny", trace, slo={"ttft": 5.0}, space=SPACE, requests=6, top=4, results=str(results),
                profiles=profiles, progress=False, **options)


def test_a_tiny_search_writes_its_runs_and_recommends_the_best(one_thread, trace, tmp_path, profiles, capsys):
    data = run(trace, tmp_path / "t.json", profiles)
    written = json.loads((tmp_path / "t.json").read_text())
    assert written["recommendation"]["key"] == data["recommendation"]["key"]
    assert len(written["predicted"]) == 4 and len(written["measured"]) == 4  # one short run each, the rest reused
    best = max(written["measured"].values(), key=lambda m: m["goodput"])
    assert written["recommendation"]["measured"]["goodput"] == best["goodput"]
    printed = capsys.readouterr().out
    for line in ("the configurations really run", "the simulator's error", "the Pareto front", "LLM('tiny', ",
                 "python -m minillm serve --model tiny --max-num-seqs "):
        assert line in printed


def test_a_resumed_search_repeats_no_measurement(one_thread, trace, tmp_path, profiles, monkeypatch):
    run(trace, tmp_path / "t.json", profiles)
    monkeypatch.setattr(search, "measure", lambda *a: pytest.fail("measured again"))
    monkeypatch.setattr(search, "predict", lambda *a: pytest.fail("predicted again"))
    run(trace, tmp_path / "t.json", profiles)


def test_ctrl_c_keeps_what_was_measured_and_says_how_to_resume(one_thread, trace, tmp_path, profiles, monkeypatch,
                                                                capsys):
    real, calls = search.measure, []

    def interrupted_second(*args):  # Ctrl-C during the second real run
        calls.append(args)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(search, "measure", interrupted_second)
    with pytest.raises(KeyboardInterrupt):
        run(trace, tmp_path / "t.json", profiles)
    assert "interrupted: 1 real runs" in capsys.readouterr().out
    assert len(json.loads((tmp_path / "t.json").read_text())["measured"]) == 1
    calls.append("resumed")
    run(trace, tmp_path / "t.json", profiles)
    assert len(calls[calls.index("resumed") + 1:]) == 3  # the resumed search measures the three it had not


def test_a_results_file_of_other_inputs_is_refused(one_thread, trace, tmp_path, profiles):
    run(trace, tmp_path / "t.json", profiles)
    with pytest.raises(ValueError, match=r"other inputs \(slo: \{'ttft': 5.0\} there, \{'ttft': 9.0\} now\)"):
        tune("tiny", trace, slo={"ttft": 9.0}, space=SPACE, requests=6, results=str(tmp_path / "t.json"),
             profiles=profiles, progress=False)


def test_an_slo_no_configuration_meets_names_the_closest(one_thread, trace, tmp_path, profiles):
    with pytest.raises(TuneError, match=r"no configuration meets the SLO \{'ttft': 1e-06\}: the closest measured, "):
        tune("tiny", trace, slo={"ttft": 1e-6}, space={"max_num_seqs": [2, 8]}, requests=6,
             results=str(tmp_path / "t.json"), profiles=profiles, progress=False)


def test_a_memory_budget_smaller_than_the_weights_is_named(tmp_path, profiles):
    with pytest.raises(TuneError, match=r"the memory budget of 1.0 MB is smaller than the weights alone: none "
                                        r"weights need [0-9.]+ MB"):
        tune("tiny", "chat", space=SPACE, memory_budget=10**6, results=str(tmp_path / "t.json"), profiles=profiles)


def test_the_cost_objective_prices_interactive_against_batch(one_thread, trace, tmp_path, profiles, capsys):
    data = tune("tiny", trace, "cost", slo={"ttft": 5.0}, space={"max_num_seqs": [2, 8]}, requests=6, top=2,
                price_per_hour=0.089, results=str(tmp_path / "t.json"), profiles=profiles, progress=False)
    cost = data["cost"]
    assert cost["batch_usd_per_1m"] > 0 and cost["interactive_usd_per_1m"] > 0
    assert cost["saving"] == 1 - cost["batch_usd_per_1m"] / cost["interactive_usd_per_1m"]
    assert "cost per 1M output tokens at $0.089/hour: interactive at the SLO $" in capsys.readouterr().out


def test_the_cost_objective_needs_a_price(tmp_path):
    with pytest.raises(TuneError, match="the cost objective needs --price-per-hour"):
        tune("tiny", "chat", "cost", results=str(tmp_path / "t.json"))
