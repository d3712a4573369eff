"""Serving metrics (minillm/perf/serving.py) against hand-computed timestamps and numpy's percentiles.

Times are binary fractions (0.25, 0.375, ...) so every difference is exact and an SLO boundary
test compares equal values, not values a rounding error apart."""
import math

import numpy as np
import pytest

from minillm.perf.serving import RequestRecord, goodput, percentile, request_metrics, summarize


def record(rid, start, chunks, end, out, prompt=10, success=True):
    return RequestRecord(rid, start, list(chunks), end, prompt, out, success, "" if success else "boom")


def test_request_metrics_follow_the_definitions():
    r = record("a", 1.0, [1.25, 1.375, 1.5, 1.75], 1.75, out=4)
    m = request_metrics(r)
    assert m.ttft == 0.25                      # first chunk - start
    assert m.itl == [0.125, 0.125, 0.25]       # gaps between chunks
    assert m.e2e == 0.75                       # end - start
    assert m.tpot == pytest.approx((0.75 - 0.25) / 3)  # (E2E - TTFT) / (tokens - 1)


def test_tpot_uses_the_token_count_not_the_chunk_count():
    # a server that sends two tokens per chunk (speculative decoding): 3 chunks, 6 tokens
    m = request_metrics(record("a", 0.0, [0.5, 0.75, 1.0], 1.0, out=6))
    assert m.tpot == pytest.approx(0.5 / 5)
    assert m.itl == [0.25, 0.25]


def test_single_token_request_has_no_tpot_and_failed_ones_have_no_metrics():
    assert request_metrics(record("a", 0.0, [0.5], 0.5, out=1)).tpot is None
    with pytest.raises(ValueError, match="'b'"):
        request_metrics(record("b", 0.0, [], None, out=0, success=False))


@pytest.mark.parametrize("q", [0, 10, 50, 90, 99, 100])
def test_percentile_matches_numpy(q):
    values = [0.3, -1.0, 2.5, 0.3, 7.0, 4.25, 0.0]
    assert percentile(values, q) == pytest.approx(np.percentile(values, q))
    assert percentile([5.0], q) == 5.0


def test_goodput_counts_exactly_the_requests_meeting_every_slo():
    rs = [
        record("fast", 0.0, [0.25, 0.375], 0.375, out=2),    # ttft .25 (at the limit), tpot .125 (at it)
        record("slow-first", 0.0, [0.5, 0.5625], 0.5625, out=2),  # ttft .5 > .25
        record("slow-decode", 0.0, [0.125, 0.5], 0.5, out=2),     # tpot .375 > .125
        record("one-token", 0.0, [0.25], 0.25, out=1),       # no TPOT: that SLO holds vacuously
        record("failed", 0.0, [], None, out=0, success=False),
    ]
    slo = {"ttft": 0.25, "tpot": 0.125}
    assert goodput(rs, 2.0, slo) == 2 / 2.0
    assert goodput(rs, 2.0, {"ttft": 0.125}) == 1 / 2.0    # only slow-decode's first token is that fast
    assert goodput(rs, 2.0, {}) == 4 / 2.0                 # no SLO: every successful request
    with pytest.raises(ValueError, match="latency"):
        goodput(rs, 2.0, {"latency": 1.0})


def test_summarize_against_hand_computed_figures():
    rs = [record("a", 0.0, [0.25, 0.5, 0.75], 0.75, out=3, prompt=8),
          record("b", 0.5, [1.0, 1.5], 1.5, out=2, prompt=4),
          record("c", 0.0, [], None, out=0, success=False)]
    s = summarize(rs, duration=2.0, slo={"ttft": 0.25})
    assert (s["completed"], s["failed"]) == (2, 1)
    assert s["request_throughput"] == 1.0
    assert s["output_throughput"] == 5 / 2.0
    assert s["total_token_throughput"] == (5 + 12) / 2.0
    ttfts, e2es, itls, tpots = [0.25, 0.5], [0.75, 1.0], [0.25, 0.25, 0.5], [0.25, 0.5]
    for name, values in [("ttft", ttfts), ("e2e", e2es), ("itl", itls), ("tpot", tpots)]:
        assert s[f"{name}_mean"] == pytest.approx(np.mean(values))
        assert s[f"{name}_median"] == pytest.approx(np.median(values))
        assert s[f"{name}_p90"] == pytest.approx(np.percentile(values, 90))
        assert s[f"{name}_p99"] == pytest.approx(np.percentile(values, 99))
    assert s["goodput"] == 0.5 and s["slo_attainment"] == 0.5
    assert s["good_output_throughput"] == 3 / 2.0  # only a (3 tokens) had its first token within 0.25 s


def test_summarize_with_no_success_reports_nan_latencies():
    s = summarize([record("c", 0.0, [], None, out=0, success=False)], duration=1.0)
    assert s["completed"] == 0 and s["failed"] == 1 and math.isnan(s["ttft_p99"])
    assert "goodput" not in s


def test_cost_per_million_tokens_and_the_online_point_chosen():
    from minillm.perf.cost import best_online_load, cost_per_million_tokens, online_vs_batch
    assert cost_per_million_tokens(3.6, 1.0) == pytest.approx(1e6 / 1000)  # $3.6/h = $0.001/s; 1 tok/s
    assert cost_per_million_tokens(2.0, 100.0) == pytest.approx(2.0 / 360_000 * 1e6)
    points = [{"rate": 1, "output_throughput": 10.0, "good_output_throughput": 10.0},
              {"rate": 2, "output_throughput": 20.0, "good_output_throughput": 19.0},
              {"rate": 4, "output_throughput": 30.0, "good_output_throughput": 12.0},  # fast, but mostly late
              {"rate": 8, "output_throughput": 31.0, "good_output_throughput": 0.0}]
    assert best_online_load(points)["rate"] == 2
    assert best_online_load(points[3:]) is None
    cost = online_vs_batch(1.0, 19.0, 38.0)
    assert cost["batch_cheaper_x"] == pytest.approx(2.0)
    assert online_vs_batch(1.0, None, 38.0)["online_usd_per_1m"] is None
