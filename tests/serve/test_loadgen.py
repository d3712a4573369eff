"""The load generator's parts: the SSE parser, the arrival process, the workload, and a live run
against the in-process OpenAI-compatible server."""
import json
import math
import time

import numpy as np
import pytest

from minillm.models.registry import resolve_model_path
from minillm.serve.arrivals import arrival_times
from minillm.serve.load_prompts import make_workload
from minillm.serve.sse import parse_sse
from minillm.tokenizer import Tokenizer


# -- server-sent events -------------------------------------------------------------------------
def test_parse_sse_decodes_json_events_and_done():
    lines = ['data: {"a": 1}', "", 'data: {"b": [2, 3]}', "", "data: [DONE]", ""]
    assert list(parse_sse(lines)) == [{"a": 1}, {"b": [2, 3]}, "[DONE]"]


def test_parse_sse_joins_multi_line_data_with_newlines():
    lines = ['data: {"text":', 'data: "x"}', "", "data: one", "data:two", "", "data: ", "data: z", ""]
    assert list(parse_sse(lines)) == [{"text": "x"}, "one\ntwo", "\nz"]


def test_parse_sse_ignores_comments_and_other_fields():
    lines = [": keep-alive", "event: message", 'data: {"a": 1}', "id: 7", ": another", "retry: 10", "",
             ":only a comment", ""]
    assert list(parse_sse(lines)) == [{"a": 1}]


def test_parse_sse_handles_crlf_cr_and_whole_chunks():
    raw = 'data: {"a": 1}\r\n\r\ndata: {"b": 2}\r\rdata: [DONE]\n\n'
    assert list(parse_sse([raw])) == [{"a": 1}, {"b": 2}, "[DONE]"]
    assert list(parse_sse(raw.splitlines(keepends=True))) == [{"a": 1}, {"b": 2}, "[DONE]"]
    # lines as a file yields them: each with its own ending, which is not a blank line
    assert list(parse_sse(["data: x\n", "data: y\n", "\n"])) == ["x\ny"]


def test_parse_sse_yields_the_last_event_without_a_trailing_blank_line():
    assert list(parse_sse(['data: {"a": 1}', "", "data: [DONE]"])) == [{"a": 1}, "[DONE]"]
    assert list(parse_sse([])) == []


def test_parse_sse_keeps_colons_and_spaces_inside_the_payload():
    payload = {"text": "a: b\n  c", "url": "http://x"}
    assert list(parse_sse(["data: " + json.dumps(payload), ""])) == [payload]
    assert list(parse_sse(["data:  two spaces", ""])) == [" two spaces"]


# -- arrivals -----------------------------------------------------------------------------------
def test_arrivals_are_seeded_sorted_and_all_at_once_at_infinite_rate():
    a = arrival_times(50, 4.0, seed=3)
    assert a == arrival_times(50, 4.0, seed=3) and a != arrival_times(50, 4.0, seed=4)
    assert all(x < y for x, y in zip(a, a[1:])) and a[0] > 0
    assert arrival_times(5, math.inf, seed=0) == [0.0] * 5
    assert arrival_times(0, 1.0, seed=0) == []
    for bad in [dict(rate=0.0), dict(rate=-1.0), dict(burstiness=0.0)]:
        with pytest.raises(ValueError):
            arrival_times(3, **{"rate": 1.0, "seed": 0, **bad})


N = 20_000


@pytest.mark.parametrize("rate,shape", [(4.0, 1.0), (0.5, 1.0), (4.0, 0.25), (2.0, 4.0)])
def test_arrival_gaps_have_mean_one_over_rate_and_cv_one_over_sqrt_shape(rate, shape):
    gaps = np.diff([0.0, *arrival_times(N, rate, seed=0, burstiness=shape)])
    mean, cv = gaps.mean(), gaps.std() / gaps.mean()
    # Gamma(k, scale): mean 1/rate, CV 1/sqrt(k). Five standard errors of N samples: the mean's
    # relative error is CV/sqrt(N); the sample std's is sqrt((kurtosis - 1) / 4N), kurtosis 3 + 6/k.
    mean_rel = 1 / math.sqrt(shape * N)
    std_rel = math.sqrt((2 + 6 / shape) / (4 * N))
    assert abs(mean * rate - 1) < 5 * mean_rel
    assert abs(cv * math.sqrt(shape) - 1) < 5 * (std_rel + mean_rel)


def test_poisson_gaps_pass_a_ks_test_against_the_exponential():
    rate = 3.0
    gaps = np.sort(np.diff([0.0, *arrival_times(N, rate, seed=1)]))
    cdf = 1 - np.exp(-rate * gaps)  # the exponential's closed form
    ranks = np.arange(1, N + 1) / N
    d = max(np.max(ranks - cdf), np.max(cdf - (ranks - 1 / N)))
    assert d < 1.95 / math.sqrt(N)  # Kolmogorov's critical value at alpha = 0.001
    bursty = np.sort(np.diff([0.0, *arrival_times(N, rate, seed=1, burstiness=0.25)]))
    d_bursty = np.max(np.abs(np.arange(1, N + 1) / N - (1 - np.exp(-rate * bursty))))
    assert d_bursty > 1.95 / math.sqrt(N)  # the test can tell a gamma process from a Poisson one


def test_gaps_pass_scipys_ks_tests_for_the_exponential_and_the_gamma():
    stats = pytest.importorskip("scipy.stats")
    rate = 3.0
    assert stats.kstest(np.diff([0.0, *arrival_times(N, rate, seed=2)]), "expon", args=(0, 1 / rate)).pvalue > 1e-3
    bursty = np.diff([0.0, *arrival_times(N, rate, seed=2, burstiness=0.5)])
    assert stats.kstest(bursty, "gamma", args=(0.5, 0, 1 / (rate * 0.5))).pvalue > 1e-3


# -- workload -----------------------------------------------------------------------------------
@pytest.mark.parametrize("source", ["corpus", "synthetic"])
def test_workload_is_seeded_with_the_asked_lengths(source):
    a = make_workload(6, seed=1, prompt_len=40, output_len=12, range_ratio=0.5, source=source)
    assert a == make_workload(6, seed=1, prompt_len=40, output_len=12, range_ratio=0.5, source=source)
    assert a != make_workload(6, seed=2, prompt_len=40, output_len=12, range_ratio=0.5, source=source)
    assert all(6 <= w.max_tokens <= 18 for w in a) and len({w.max_tokens for w in a}) > 1
    tokenizer = Tokenizer(resolve_model_path("tiny"))
    lengths = [len(tokenizer.encode(w.prompt)) for w in a]
    assert all(15 <= n <= 65 for n in lengths), lengths  # 20..60 tokens asked; re-encoding may merge a few


# -- against the live in-process server ---------------------------------------------------------
@pytest.fixture(scope="module")
def llm():
    from minillm.async_llm import AsyncLLM
    return AsyncLLM("tiny", max_num_seqs=8)


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    """The most intervals open at one instant (an end at t closes before a start at t opens)."""
    edges = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals], key=lambda x: (x[0], x[1]))
    best = now = 0
    for _, step in edges:
        now += step
        best = max(best, now)
    return best


@pytest.mark.timeout(60)
def test_fixed_concurrency_run_succeeds_with_usage_counts_and_never_exceeds_its_limit(server):
    import asyncio

    from minillm.serve.loadgen import run_load
    items = make_workload(6, seed=0, prompt_len=24, output_len=6, range_ratio=0.5, source="synthetic")
    per_step = []  # requests the engine computed in each step: the server's view of the concurrency
    observer = lambda event: per_step.append(len({w.request_id for w in event.scheduled}))  # noqa: E731
    server.llm.engine.subscribe(observer)
    try:
        result = asyncio.run(run_load(server.base_url, items, max_concurrency=2, ignore_eos=True, progress=False))
    finally:
        server.llm.engine.unsubscribe(observer)
    tokenizer = Tokenizer(resolve_model_path("tiny"))
    assert all(r.success for r in result.records), [r.error for r in result.records]
    assert [r.output_tokens for r in result.records] == [w.max_tokens for w in items]  # ignore_eos: all asked
    assert [r.prompt_tokens for r in result.records] == [len(tokenizer.encode(w.prompt)) for w in items]
    assert all(len(r.chunk_times) <= r.output_tokens for r in result.records)
    assert max(per_step) == 2 and max_overlap([(r.start, r.end) for r in result.records]) == 2
    assert result.duration >= max(r.end for r in result.records) - min(r.start for r in result.records)


@pytest.mark.timeout(60)
def test_open_loop_run_uses_the_given_arrivals_and_parser_and_records_failures(server):
    import asyncio

    from minillm.serve.loadgen import run_load
    items = make_workload(3, seed=1, prompt_len=16, output_len=4, source="synthetic")
    calls = {"arrivals": [], "events": 0}

    def arrivals(n, rate, seed, burstiness):
        calls["arrivals"].append((n, rate, seed, burstiness))
        return [0.0, 0.25, 0.5]

    def parser(lines):
        calls["events"] += 1
        return parse_sse(lines)

    before = time.perf_counter()  # the run's own clock starts after this
    result = asyncio.run(run_load(server.base_url, items, rate=4.0, seed=9, arrivals=arrivals, parse_sse=parser,
                                  progress=False))
    assert all(r.success for r in result.records) and calls["arrivals"] == [(3, 4.0, 9, 1.0)]
    assert calls["events"] >= sum(len(r.chunk_times) for r in result.records) + 3  # + each stream's [DONE]
    # No request leaves before its arrival time (a busy machine can only make them later).
    assert [r.start >= before + t for r, t in zip(result.records, [0.0, 0.25, 0.5])] == [True] * 3
    failed = asyncio.run(run_load(server.base_url, items[:1], model="no-such-model", progress=False))
    assert not failed.records[0].success and "404" in failed.records[0].error
