"""The Serving page: a small load test against the in-process server completes every request, the client's
figures match numpy on the same records, the server's /metrics count the same requests and tokens, the charts
and the cost follow their formulas, the SLOs apply without rerunning, and the server stops when released."""
import math

import numpy as np
import pytest
from app_pages import APP, errors, figures
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from minillm_visualizer.serving.run import parse_metrics, server, sweep_rates

pytestmark = pytest.mark.timeout(240)
SMALL = {"k_serve_requests": 3, "k_serve_max_tokens": 8, "k_serve_prompt_tokens": 16, "k_serve_rate": 0.0,
         "k_serve_model": "tiny", "k_serve_price": 3.6}


@pytest.fixture(scope="module", autouse=True)
def stop_the_server():
    """The page's server lives in st.cache_resource; releasing it must stop its thread."""
    yield
    handles = [server("tiny")]  # a cache hit: the handle the page used
    server.clear()
    assert not handles[0].thread.is_alive(), "clearing the cache stops the server"


def page(settings: dict):
    from streamlit.testing.v1 import AppTest
    at = AppTest.from_file(str(APP), default_timeout=180)
    for key, value in settings.items():
        at.session_state[key] = value
    at.switch_page("minillm_visualizer/serving/serving.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def run_load(at):
    at.button(key="serve_b_run").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert not errors(at), errors(at)
    return at.session_state["serve_result"]["points"]


def metrics(at) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def test_a_small_run_completes_every_request_and_the_figures_agree():
    at = page(SMALL)
    assert at.title[0].value == "Serving"
    assert any("Press **Run the load test**" in i.value for i in at.info)
    [point] = run_load(at)
    assert math.isinf(point.rate)
    assert point.summary["completed"] == 3 and point.summary["failed"] == 0
    assert [r.output_tokens for r in point.records] == [8, 8, 8], "ignore_eos: every request makes max_tokens"
    assert all(len(r.chunk_times) == 8 for r in point.records), "one streamed chunk per token"
    ttft = np.array([r.chunk_times[0] - r.start for r in point.records])
    assert point.summary["ttft_median"] == pytest.approx(np.percentile(ttft, 50))
    itl = np.concatenate([np.diff(r.chunk_times) for r in point.records])
    assert point.summary["itl_p99"] == pytest.approx(np.percentile(itl, 99))
    assert point.summary["output_throughput"] == pytest.approx(24 / point.duration)

    shown = metrics(at)  # the server counted what the clients saw
    assert shown["Responses started"] == "3 of 3" and shown["Finished"] == "3"
    assert shown["Tokens generated"] == "24"
    assert point.server_figures["minillm_inter_token_latency_seconds_count"] == 3 * 7, "7 gaps after 8 tokens"
    assert point.server_figures["minillm_num_requests_running"] == 0
    assert "minillm_time_to_first_token_seconds_bucket" in point.server_text

    charts = figures(at)
    curve = charts["Latency against throughput"]["data"]
    assert curve[0]["x"] == [pytest.approx(24 / point.duration)]
    assert curve[0]["y"] == [pytest.approx(1000 * np.percentile(ttft, 50))]
    ttft_hist, p50, p90, p99 = charts["TTFT and ITL distributions (all at once)"]["data"][:4]
    assert sum(ttft_hist["y"]) == 3
    for trace, q in ((p50, 50), (p90, 90), (p99, 99)):
        assert trace["name"] == f"p{q}" and trace["x"] == [pytest.approx(1000 * np.percentile(ttft, q))] * 2
    bars = charts["Cost per million output tokens at $3.6/hour"]["data"]
    # $3.6 an hour is $0.001 a second: a million tokens at T tokens/s cost 1e6 / T * 0.001 dollars
    assert bars[0]["y"] == [pytest.approx(1e3 / (24 / point.duration))]


def test_the_slos_apply_to_the_last_run_without_rerunning():
    at = page({**SMALL, "k_serve_requests": 2, "k_serve_max_tokens": 4})
    [point] = run_load(at)
    at.number_input(key="k_serve_slo_ttft_ms").set_value(1.0).run()  # no request gets a token within 1 ms
    bars = figures(at)["Cost per million output tokens at $3.6/hour"]["data"]
    assert bars[1]["y"] == [None] and bars[1]["text"] == ["none met the SLOs"]
    assert any(c.value.startswith("Cost per million") and "No request met the SLOs at any rate" in c.value
               for c in at.caption)
    assert at.session_state["serve_result"]["points"][0] is point, "nothing was rerun"
    at.number_input(key="k_serve_slo_ttft_ms").set_value(60000.0).run()
    at.number_input(key="k_serve_slo_tpot_ms").set_value(10000.0).run()
    bars = figures(at)["Cost per million output tokens at $3.6/hour"]["data"]
    assert bars[1]["y"] == bars[0]["y"], "every request met loose SLOs: good tokens are all the tokens"
    assert any("here all at once, " in c.value for c in at.caption), "the only point is the online one"


def test_a_sweep_draws_one_point_per_offered_rate():
    at = page({**SMALL, "k_serve_requests": 2, "k_serve_max_tokens": 4, "k_serve_rate": 20.0,
               "k_serve_sweep": True})
    points = run_load(at)
    assert [p.rate for p in points] == [5.0, 10.0, 20.0, math.inf]
    assert all(p.summary["completed"] == 2 for p in points)
    curve = figures(at)["Latency against throughput"]["data"][0]
    assert curve["customdata"] == ["5 req/s", "10 req/s", "20 req/s", "all at once"]
    at.selectbox(key="k_serve_shown").set_value("5 req/s").run()
    assert "TTFT and ITL distributions (5 req/s)" in figures(at)


def test_a_sweep_without_a_rate_says_why():
    at = page({**SMALL, "k_serve_sweep": True})
    assert any(e.startswith("Cannot sweep: a sweep needs an arrival rate > 0") for e in errors(at)), errors(at)
    with pytest.raises(ValueError, match="got 0.0"):
        sweep_rates(0.0, True)
    assert sweep_rates(0.0, False) == [math.inf] and sweep_rates(8.0, True) == [2.0, 4.0, 8.0, math.inf]


def test_parse_metrics_sums_labels_and_counts_only_completions():
    registry = CollectorRegistry()
    requests = Counter("minillm_requests", "", ["endpoint", "status"], registry=registry)
    requests.labels("/v1/completions", "200").inc(5)
    requests.labels("/v1/completions", "429").inc(2)
    requests.labels("/metrics", "200").inc(40)
    Counter("minillm_generation_tokens", "", registry=registry).inc(17)
    Gauge("minillm_num_requests_waiting", "", registry=registry).set(3)
    parsed = parse_metrics(generate_latest(registry).decode())
    assert parsed["minillm_requests_total"] == 7
    assert parsed["minillm_generation_tokens_total"] == 17 and parsed["minillm_num_requests_waiting"] == 3


def test_my_lab_08_notebook_runs_the_load_test_with_the_learners_parts():
    solutions = str(APP.parents[1] / "solutions")
    at = page({**SMALL, "k_serve_mine": True, "k_serve_folder": solutions})
    assert any("Your parts: 8.1 `parse_sse`, 8.4 `arrival_times`, 8.5 `admit`" in c.value for c in at.caption)
    [point] = run_load(at)
    assert point.summary["completed"] == 3
    assert any("with your lab 08 parts" in c.value for c in at.caption)
    handle = server("tiny", solutions, max(p.stat().st_mtime for p in (APP.parents[1] / "solutions").glob(
        "lab08_*.ipynb")))
    assert handle.llm.engine.config.components.replaced() == ["grammar_mask"]
    handle.stop()


def test_an_unfinished_lab_08_notebook_stops_the_run_with_the_exercise_named(tmp_path):
    from minillm.labkit.notebook import learner_copy, read_source, to_json
    source = next((APP.parents[1] / "solutions").glob("lab08_*.py"))
    (tmp_path / f"{source.stem}.ipynb").write_text(to_json(learner_copy(read_source(source), source.stem)))
    at = page({**SMALL, "k_serve_mine": True, "k_serve_folder": str(tmp_path)})
    at.button(key="serve_b_run").click().run()
    assert any("Your lab 08 parts could not run" in e.value and "Exercise 8." in e.value for e in at.error)
    assert "serve_result" not in at.session_state
