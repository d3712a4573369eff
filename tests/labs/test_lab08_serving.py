"""Grader of lab 08, serving.

Oracles: the official `openai` client's SSE decoder (complete streams), numpy's percentile and
numpy's gamma draws, the exponential and gamma distributions' closed forms (mean, coefficient of
variation, a Kolmogorov-Smirnov statistic against the exponential CDF), xgrammar's own bitmask
kernel, the formulas of vLLM's serving benchmark written out here, fixed cases computed by hand,
and the engine's reference parts (minillm/agents/breaker.py for the breaker's exact rules). For
8.E the learner's parts run inside the real engine, server, load generator and agent harness.
"""
import asyncio
import concurrent.futures
import functools
import json
import math
import random

import httpx
import jsonschema
import numpy as np
import pytest
import torch
from openai._streaming import SSEDecoder

from minillm import LLM, SamplingParams
from minillm.agents.breaker import LoopBreaker
from minillm.agents.harness import run_sessions
from minillm.agents.sessions import agent_workload
from minillm.labkit import exercise
from minillm.labkit.fixtures import assert_close, one_thread
from minillm.labkit.plug import calls, lab_components, lab_parts
from minillm.perf.serving import RequestMetrics, RequestRecord, goodput, request_metrics
from minillm.serve.admission import admit
from minillm.serve.arrivals import arrival_times
from minillm.serve.load_prompts import make_workload
from minillm.serve.loadgen import run_load
from minillm.serve.server import serve_in_thread
from minillm.structured import StructuredOutput

xgr = pytest.importorskip("xgrammar")

EXERCISES = {"8.1": "parse_sse", "8.2": "request_metrics", "8.3": "percentile, goodput", "8.4": "arrival_times",
             "8.5": "admit", "8.6": "apply_grammar_mask", "8.7": "cost_per_million_tokens", "8.8": "LoopBreaker",
             "8.E": "your parts in the real serving stack"}


def run_async(coroutine):
    """asyncio.run in a thread of its own: check() runs the grader inside Jupyter, whose event loop is running."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()




# -- 8.1 parse_sse ------------------------------------------------------------------------------------
# The characters str.splitlines() also breaks lines at, which SSE does not: they belong to the text.
NOT_LINE_ENDS = "\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"


def openai_payloads(text: str) -> list:
    """The payloads the official openai client's SSE decoder finds in a complete stream."""
    out = []
    for event in SSEDecoder().iter_bytes(iter([text.encode()])):
        if event.data == "[DONE]":
            out.append("[DONE]")
            continue
        try:
            out.append(json.loads(event.data))
        except json.JSONDecodeError:
            out.append(event.data)
    return out


def odd_text(rng: random.Random) -> str:
    """A short text with some of the characters SSE does not end lines at, tabs and trailing spaces."""
    return "".join(rng.choice(["a", "é", " ", "\t", ":", *NOT_LINE_ENDS]) for _ in range(rng.randint(1, 6)))


def random_event(rng: random.Random, i: int, odd: bool) -> list[str]:
    """The lines of one event: comments and fields that carry nothing (odd: with odd text in them, field names
    that are not data by case or a leading space), then one or more data lines, JSON or plain text."""
    lines = []
    if rng.random() < 0.3:
        lines.append(": keep-alive" + (odd_text(rng) if odd else ""))
    if rng.random() < 0.3:
        lines.append(f"id: {i}")
    if odd and rng.random() < 0.5:
        lines.append(rng.choice(["Data: shouted", " data: indented", "DATA:x", "event: up" + odd_text(rng),
                                 "retry: 10", "event"]))
    kind = rng.random()
    if kind < 0.4:
        text = rng.choice(["def", " x", "\n", "é", ""]) + (odd_text(rng) if odd else "")
        payload = json.dumps({"choices": [{"index": 0, "text": text}], "n": i}, ensure_ascii=not odd)
        lines.append(("data: " if rng.random() < 0.7 else "data:") + payload)
    elif kind < 0.6:
        first, second = f'{{"a": {i},', '"b": [1, 2]}'
        lines += [f"data: {first}", f"data:{second}"]
    elif kind < 0.8 or not odd:
        lines += ["data: plain text", "data:  two spaces"]
    else:  # plain text with odd characters inside and around it, a bare "data" line, a tab after the colon
        lines += ["data: " + odd_text(rng) + "x" + odd_text(rng), "data", "data:\t" + odd_text(rng), "data: a: b"]
    return lines + [""]


def random_stream(rng: random.Random, odd: bool = False) -> tuple[str, list[str]]:
    """A complete SSE stream (text) with comments, other fields, multi-line data, JSON and plain payloads, and
    [DONE], its lines ending in CRLF, CR or LF (odd: mixed within the stream, and odd text in the lines); and the
    same stream cut into items in random places: single lines without endings (like httpx's iter_lines), or
    several whole lines at once."""
    lines = [line for i in range(rng.randint(1, 6)) for line in random_event(rng, i, odd)] + ["data: [DONE]", ""]
    stream_end = rng.choice(["\n", "\r\n", "\r"])
    ends = []
    for i, line in enumerate(lines):
        end = rng.choice(["\n", "\r\n", "\r"]) if odd else stream_end
        if line == "" and i and ends[-1] == "\r" and end == "\n":
            end = "\r"  # CR then an LF-ended blank line would read as one CRLF
        ends.append(end)
    text = "".join(line + end for line, end in zip(lines, ends))
    pieces, i = [], 0
    while i < len(lines):
        take = rng.randint(1, 3)
        if take == 1 and rng.random() < 0.5:
            pieces.append(lines[i])
        else:
            pieces.append("".join(line + end for line, end in zip(lines[i:i + take], ends[i:i + take])))
        i += take
    return text, pieces


@exercise("8.1")
def test_parse_sse_decodes_random_streams_like_the_openai_client(lab):
    """30 seeded streams (comments, id fields, multi-line data, LF / CRLF / CR, lines fed one by one or several
    per item) decode to the payloads the official openai client's SSE decoder finds"""
    rng = random.Random(801)
    for case in range(30):
        text, pieces = random_stream(rng)
        want = openai_payloads(text)
        got = list(lab.parse_sse(pieces))
        assert got == want, f"stream {case} {text!r}, fed as {pieces!r}: got {got!r}, the openai client: {want!r}"
        assert list(lab.parse_sse([text])) == want, f"stream {case} given as one string: differs from openai's"


@exercise("8.1")
def test_parse_sse_ends_lines_only_at_cr_lf_and_crlf(lab):
    """40 seeded streams whose text holds the characters str.splitlines also breaks at (form feed, vertical tab,
    \\x1c-\\x1e, NEL, U+2028, U+2029), tabs, colons and trailing spaces, with field names that are data only by
    another case or after a space, and CR, LF and CRLF mixed: the payloads the openai client's decoder finds"""
    rng = random.Random(8011)
    for case in range(40):
        text, pieces = random_stream(rng, odd=True)
        want = openai_payloads(text)
        got = list(lab.parse_sse(pieces))
        assert got == want, f"stream {case} {text!r}, fed as {pieces!r}: got {got!r}, the openai client: {want!r}"
        assert list(lab.parse_sse([text])) == want, f"stream {case} {text!r} given as one string: got " \
                                                    f"{list(lab.parse_sse([text]))!r}, the openai client: {want!r}"
    for char in NOT_LINE_ENDS:
        lines = [f"data: a{char}b", f": c{char}d", f"data:{char}", ""]
        got = list(lab.parse_sse(lines))
        assert got == [f"a{char}b\n{char}"], f"parse_sse({lines!r}) gave {got!r}: {char!r} does not end an SSE line"


@exercise("8.1")
def test_parse_sse_fixed_cases(lab):
    """multi-line data joined with a newline, one space stripped (one only, nothing else), comments skipped,
    [DONE] as a string, a last event without its blank line still yielded, an event of comments or other fields
    only yields nothing, field names compared exactly, CR alone ends a line, no lines yield nothing"""
    cases = [
        (["data: {\"a\":", "data: 1}", ""], [{"a": 1}]),
        (["data:  x", ""], [" x"]),
        ([": ping", "", "data: [DONE]", ""], ["[DONE]"]),
        (["data: 1", "", "data: 2"], [1, 2]),
        (["data: a\r\ndata: b\r\n\r\n"], ["a\nb"]),
        (["event: message\nretry: 10\n\ndata: 7\n\n"], [7]),
        (["data", ""], [""]),
        (["data:", "data: b", ""], ["\nb"]),
        (["data: x \t", "data:\ty", ""], ["x \t\n\ty"]),
        (["data: a: b", ""], ["a: b"]),
        (["Data: no", " data: no", "DATA:no", "data : no", "event", "id", ""], []),
        (["data: one\rdata: two\r\rdata: three\r"], ["one\ntwo", "three"]),
        (["id: 4", "", ": only a comment", "", "data: 5", ""], [5]),
        ([], []),
        ([""], []),
    ]
    for lines, want in cases:
        got = list(lab.parse_sse(lines))
        assert got == want, f"parse_sse({lines!r}) gave {got!r}, expected {want!r}"


# -- 8.2 request_metrics ------------------------------------------------------------------------------
def random_record(rng: random.Random, i: int) -> RequestRecord:
    start = rng.uniform(0, 100)
    chunks = np.cumsum([rng.uniform(0.01, 2.0)] + [rng.uniform(0.001, 0.3) for _ in range(rng.randint(0, 12))])
    chunk_times = (start + chunks).tolist()
    tokens = len(chunk_times) + rng.randint(0, 5)  # a chunk may carry several tokens
    return RequestRecord(f"r{i}", start, chunk_times, end=chunk_times[-1] + rng.uniform(0, 0.05),
                         prompt_tokens=rng.randint(1, 50), output_tokens=tokens, success=True)


def assert_metrics(got, record: RequestRecord, what: str) -> None:
    times = np.array(record.chunk_times)
    ttft, e2e = times[0] - record.start, record.end - record.start
    assert isinstance(got, RequestMetrics), f"{what}: returns {type(got).__name__}, not a RequestMetrics"
    assert math.isclose(got.ttft, ttft, rel_tol=1e-12, abs_tol=1e-12), f"{what}: TTFT {got.ttft}, expected {ttft}"
    assert math.isclose(got.e2e, e2e, rel_tol=1e-12, abs_tol=1e-12), f"{what}: E2E {got.e2e}, expected {e2e}"
    assert np.allclose(got.itl, np.diff(times), rtol=1e-12, atol=1e-12) and len(got.itl) == len(times) - 1, \
        f"{what}: ITL {got.itl}, expected the gaps between chunks {np.diff(times).tolist()}"
    if record.output_tokens > 1:
        tpot = (e2e - ttft) / (record.output_tokens - 1)
        assert got.tpot is not None and math.isclose(got.tpot, tpot, rel_tol=1e-12), \
            f"{what}: TPOT {got.tpot}, expected (E2E - TTFT) / (output_tokens - 1) = {tpot}"
    else:
        assert got.tpot is None, f"{what}: TPOT {got.tpot} for a one-token request, expected None"


@exercise("8.2")
def test_request_metrics_match_the_formulas_on_random_records(lab):
    """TTFT, TPOT, ITL and E2E of 40 seeded records (1 to 13 chunks, chunks carrying several tokens) match
    the formulas"""
    rng = random.Random(802)
    for i in range(40):
        record = random_record(rng, i)
        assert_metrics(lab.request_metrics(record), record, f"record {record}")


@exercise("8.2")
def test_request_metrics_fixed_cases(lab):
    """start 10, chunks at 10.5, 10.6, 10.75, 10.8, end 10.9, 5 tokens: TTFT 0.5, TPOT 0.1, ITL [0.1, 0.15, 0.05],
    E2E 0.9; one token: TPOT None, ITL []; no token counted: TPOT None; two tokens in one chunk: TPOT is the
    tail; a failed request, one without chunk times and one without an end raise ValueError"""
    got = lab.request_metrics(RequestRecord("a", 10.0, [10.5, 10.6, 10.75, 10.8], 10.9, output_tokens=5,
                                            success=True))
    assert math.isclose(got.ttft, 0.5) and math.isclose(got.tpot, 0.1) and math.isclose(got.e2e, 0.9), got
    assert np.allclose(got.itl, [0.1, 0.15, 0.05]), got
    one = lab.request_metrics(RequestRecord("b", 0.0, [0.25], 0.25, output_tokens=1, success=True))
    assert one.tpot is None and list(one.itl) == [] and one.ttft == 0.25, f"a one-token request: {one}"
    none = lab.request_metrics(RequestRecord("z", 0.0, [0.25, 0.5], 0.5, output_tokens=0, success=True))
    assert none.tpot is None and math.isclose(none.e2e, 0.5), f"no output token counted (output_tokens 0): {none}"
    both = lab.request_metrics(RequestRecord("c", 0.0, [0.5], 0.75, output_tokens=2, success=True))
    assert math.isclose(both.tpot, 0.25) and list(both.itl) == [], f"two tokens in one chunk: {both}"
    for bad in (RequestRecord("d", 0.0, [1.0], 2.0, output_tokens=3, success=False, error="HTTP 500"),
                RequestRecord("e", 0.0, [], 2.0, output_tokens=3, success=True),
                RequestRecord("f", 0.0, [1.0, 1.5], None, output_tokens=3, success=True)):
        with pytest.raises(ValueError):
            got = lab.request_metrics(bad)
            raise AssertionError(f"request_metrics({bad}) returned {got}; expected a ValueError")


# -- 8.3 percentile and goodput ------------------------------------------------------------------------
@exercise("8.3")
def test_percentile_equals_numpy_on_random_values(lab):
    """percentile equals numpy.percentile (linear) for 1 to 50 seeded values of both signs (some with ties), at
    q on a grid from 0 to 100 and at seeded q, whole positions (no interpolation) included"""
    rng = np.random.default_rng(803)
    for n in (1, 2, 3, 7, 10, 50, *rng.integers(4, 60, 4).tolist()):
        values = (rng.standard_normal(n) * 10).tolist()
        if n > 3 and n % 2:
            values = np.round(values).tolist()  # ties
        whole = [100 * i / (n - 1) for i in range(n)] if n > 1 else []  # q where p = q / 100 * (n - 1) is an index
        for q in (0, 1, 25, 50, 90, 99, 99.9, 100, *rng.uniform(0, 100, 5).tolist(), *whole[:4]):
            got, want = lab.percentile(values, q), float(np.percentile(values, q))
            assert math.isclose(got, want, rel_tol=1e-12, abs_tol=1e-12), \
                f"percentile of {n} values {values} at q={q}: {got}, numpy says {want}"


@exercise("8.3")
def test_percentile_fixed_cases(lab):
    """p50 of 1..10 is 5.5, p90 is 9.1, p0 the least, p100 the largest, unsorted input, empty -> nan"""
    values = [7, 3, 10, 1, 5, 9, 2, 8, 6, 4]
    for q, want in ((50, 5.5), (90, 9.1), (0, 1), (100, 10), (99, 9.91)):
        got = lab.percentile(values, q)
        assert math.isclose(got, want), f"percentile(1..10 unsorted, {q}) = {got}, expected {want}"
    assert math.isnan(lab.percentile([], 50)), "the percentile of no values must be nan"


def good_by_hand(records: list[RequestRecord], duration: float, slo: dict) -> float:
    good = 0
    for r in records:
        if not r.success:
            continue
        m = request_metrics(r)
        good += all(getattr(m, k) is None or getattr(m, k) <= v for k, v in slo.items())
    return good / duration


@exercise("8.3")
def test_goodput_counts_requests_meeting_every_slo(lab):
    """goodput of 60 seeded records (some failed, some one-token) under 6 SLO sets, over 30 s, equals the count
    of successful requests meeting every limit divided by the duration"""
    rng = random.Random(8031)
    records = [random_record(rng, i) for i in range(60)]
    for r in records[::7]:
        r.success, r.error = False, "HTTP 500"
    for r in records[3::9]:
        r.output_tokens, r.chunk_times = 1, r.chunk_times[:1]
    for slo in ({"ttft": 1.0}, {"tpot": 0.05}, {"e2e": 2.0}, {"ttft": 1.5, "tpot": 0.1},
                {"ttft": 0.8, "tpot": 0.08, "e2e": 2.5}, {}):
        got, want = lab.goodput(records, 30.0, slo), good_by_hand(records, 30.0, slo)
        assert math.isclose(got, want), f"goodput under {slo}: {got} req/s, expected {want}"


@exercise("8.3")
def test_goodput_fixed_cases(lab):
    """a TTFT, TPOT or E2E exactly at its limit meets it; a one-token request meets any TPOT limit; a failed
    request never counts; no records give 0; a duration of 0, below 0 or NaN and unknown metric names (with
    records or without) raise ValueError"""
    at_limit = RequestRecord("a", 0.0, [0.5, 0.6], 1.0, output_tokens=3, success=True)  # TTFT 0.5, TPOT 0.25
    one = RequestRecord("b", 0.0, [0.25], 0.25, output_tokens=1, success=True)
    failed = RequestRecord("c", 0.0, [0.1], 0.2, output_tokens=2, success=False, error="HTTP 429")
    assert lab.goodput([at_limit, one, failed], 2.0, {"ttft": 0.5}) == 1.0, "TTFT 0.5 under a 0.5 s limit counts"
    assert lab.goodput([at_limit, one, failed], 2.0, {"tpot": 0.1}) == 0.5, \
        "TPOT 0.25 misses a 0.1 s limit; a one-token request (TPOT None) meets it"
    assert lab.goodput([at_limit, one], 4.0, {"tpot": 0.25, "e2e": 1.0}) == 0.5, \
        "TPOT 0.25 and E2E 1.0 exactly at their limits (0.25 s, 1 s) meet them"
    assert lab.goodput([at_limit, one], 4.0, {"e2e": 0.999}) == 0.25, "E2E 1.0 misses a 0.999 s limit"
    assert lab.goodput([failed], 1.0, {}) == 0.0, "a failed request counted"
    assert lab.goodput([], 3.0, {"ttft": 1.0}) == 0.0, "no records: goodput 0"
    for records, duration, slo in (([at_limit], 0.0, {"ttft": 1}), ([at_limit], -1.0, {}),
                                   ([at_limit], math.nan, {"ttft": 1}), ([at_limit], 1.0, {"latency": 1.0}),
                                   ([], 1.0, {"latency": 1.0}), ([failed], 1.0, {"TTFT": 1.0}), ([], math.nan, {})):
        with pytest.raises(ValueError):
            got = lab.goodput(records, duration, slo)
            raise AssertionError(f"goodput({len(records)} records, duration={duration}, slo={slo}) returned {got}; "
                                 f"expected a ValueError")


# -- 8.4 arrival_times ----------------------------------------------------------------------------------
def ks_exponential(gaps: np.ndarray, rate: float) -> float:
    """The Kolmogorov-Smirnov distance between the gaps' empirical CDF and 1 - exp(-rate x)."""
    xs = np.sort(gaps)
    cdf = 1 - np.exp(-rate * xs)
    n = len(xs)
    return float(max((np.arange(1, n + 1) / n - cdf).max(), (cdf - np.arange(n) / n).max()))


@exercise("8.4")
def test_poisson_arrivals_have_exponential_gaps_of_mean_one_over_rate(lab):
    """20000 arrivals at 4 req/s and at 0.5 req/s: ascending, mean gap 1/rate within 3%, KS distance to the
    exponential CDF under 0.015 (the 1% critical value is 0.0115 for n = 20000)"""
    for rate, seed in ((4.0, 1), (0.5, 2)):
        times = np.array(lab.arrival_times(20000, rate, seed))
        assert len(times) == 20000, f"{len(times)} arrival times for n = 20000"
        gaps = np.diff(np.concatenate([[0.0], times]))
        assert (gaps >= 0).all(), f"rate {rate}: arrival times are not ascending"
        assert abs(gaps.mean() * rate - 1) < 0.03, f"rate {rate}: mean gap {gaps.mean():.4f} s, expected {1 / rate}"
        ks = ks_exponential(gaps, rate)
        assert ks < 0.015, f"rate {rate}: the gaps are not exponential (KS distance {ks:.4f})"


@exercise("8.4")
def test_bursty_arrivals_keep_the_mean_and_raise_the_variation(lab):
    """gamma gaps of shape 0.25 and 4: mean 1/rate within 4%, coefficient of variation 1/sqrt(shape) within 5%"""
    for burstiness in (0.25, 4.0):
        times = np.array(lab.arrival_times(20000, 2.0, 7, burstiness))
        gaps = np.diff(np.concatenate([[0.0], times]))
        assert abs(gaps.mean() * 2.0 - 1) < 0.04, f"burstiness {burstiness}: mean gap {gaps.mean():.4f}, expected 0.5"
        cv, want = gaps.std() / gaps.mean(), 1 / math.sqrt(burstiness)
        assert abs(cv / want - 1) < 0.05, \
            f"burstiness {burstiness}: coefficient of variation {cv:.3f}, expected {want:.3f}"


@exercise("8.4")
def test_arrivals_are_seeded_numpy_gamma_draws(lab):
    """the same seed gives the same times, another seed others; the times are the cumulative sums of
    np.random.default_rng(seed).gamma(burstiness, 1 / (rate * burstiness), n), the engine's arrivals"""
    for n, rate, seed, k in ((5, 3.0, 0, 1.0), (12, 0.7, 42, 0.5), (1, 10.0, 9, 2.0)):
        got = lab.arrival_times(n, rate, seed, k)
        want = np.cumsum(np.random.default_rng(seed).gamma(k, 1 / (rate * k), n))
        assert isinstance(got, list) and np.allclose(got, want, rtol=1e-12), \
            f"arrival_times({n}, {rate}, {seed}, {k}) = {got}, expected {want.tolist()}"
        assert got == lab.arrival_times(n, rate, seed, k), "the same seed gave different times"
    assert lab.arrival_times(5, 3.0, 0) != lab.arrival_times(5, 3.0, 1), "seeds 0 and 1 gave the same times"


@exercise("8.4")
def test_arrivals_fixed_cases(lab):
    """rate inf sends all at t = 0; n = 0 gives []; rate <= 0 or NaN, burstiness <= 0, inf or NaN, and n < 0 or
    not an integer raise ValueError"""
    assert lab.arrival_times(4, math.inf, 0) == [0.0] * 4, "rate = inf must send every request at t = 0"
    assert lab.arrival_times(0, 2.0, 0) == [], "n = 0 must give no times"
    for args in ((3, 0.0, 0, 1.0), (3, -1.0, 0, 1.0), (3, math.nan, 0, 1.0), (3, 1.0, 0, 0.0), (3, 1.0, 0, -2.0),
                 (3, 1.0, 0, math.inf), (3, 1.0, 0, math.nan), (-1, 1.0, 0, 1.0), (2.5, 1.0, 0, 1.0)):
        with pytest.raises(ValueError):
            got = lab.arrival_times(*args)
            raise AssertionError(f"arrival_times{args} returned {got}; expected a ValueError")


# -- 8.5 admit ------------------------------------------------------------------------------------------
@exercise("8.5")
def test_admit_fixed_cases(lab):
    """max 4: 3 waiting admitted; 4 waiting at 2/s -> 1 s; 9 at 2/s -> 3 s; 9 at 0.5/s -> 12 s; 9 with no drain
    -> 6 s, with a negative drain rate too; 20 at 100/s -> 1 s (never 0)"""
    assert lab.admit(3, 4, 2.0) is None, "3 waiting under a max of 4 must be admitted (None)"
    assert lab.admit(0, 1, 0.0) is None, "an empty queue must admit"
    for args, want in (((4, 4, 2.0), 1), ((9, 4, 2.0), 3), ((9, 4, 0.5), 12), ((9, 4, 0.0), 6), ((20, 4, 100.0), 1),
                       ((5, 4, 0.4), 5), ((9, 4, -3.0), 6), ((7, 7, 0.0), 1)):
        got = lab.admit(*args)
        assert got is not None and math.isclose(got, want), f"admit{args} = {got}, expected {want} s"


@exercise("8.5")
def test_admit_matches_the_rule_on_random_queues(lab):
    """500 seeded (waiting, max, drain rate) cases (no drain, a negative one, exactly full queues): None below the
    max, else the reference's Retry-After: whole seconds, never early, at least 1"""
    rng = random.Random(805)
    for _ in range(500):
        max_waiting = rng.randint(1, 20)
        waiting = rng.randint(0, 40)
        drain = rng.choice([0.0, rng.uniform(0.05, 50.0), rng.uniform(0.05, 50.0), -rng.uniform(0.05, 5.0)])
        got = lab.admit(waiting, max_waiting, drain)
        if waiting < max_waiting:
            assert got is None, f"admit({waiting}, {max_waiting}, {drain}) = {got}: below the max, admit (None)"
            continue
        want = max(1, math.ceil((waiting - max_waiting + 1) / (drain if drain > 0 else 1.0)))
        assert got is not None and math.isclose(got, want), f"admit({waiting}, {max_waiting}, {drain}) = {got}, " \
                                                            f"expected {want}"


# -- 8.6 apply_grammar_mask ----------------------------------------------------------------------------
@exercise("8.6")
def test_grammar_mask_equals_xgrammars_kernel(lab):
    """on seeded random bitmasks (every bit pattern, sign bits included, extra words past the vocabulary) over
    float32, bfloat16 and float16 logits the mask keeps exactly the logits xgrammar's apply_token_bitmask_inplace
    keeps, unchanged and in their dtype, and -inf elsewhere"""
    dtypes = (torch.float32, torch.bfloat16, torch.float16)
    with one_thread():
        for case, (rows, vocab, extra_words) in enumerate(((1, 32, 0), (3, 4096, 0), (5, 1000, 0), (2, 33, 1),
                                                           (4, 70, 2), (3, 64, 1))):
            gen = torch.Generator().manual_seed(rows * vocab + extra_words)
            words = (vocab + 31) // 32 + extra_words
            bitmask = torch.randint(-2**31, 2**31 - 1, (rows, words), generator=gen, dtype=torch.int64).to(torch.int32)
            bitmask[0, 0] = -1
            bitmask[-1, -1] = -2**31
            logits = (torch.randn(rows, vocab, generator=gen) * 5).to(dtypes[case % 3])
            expected = logits.clone()
            xgr.apply_token_bitmask_inplace(expected, bitmask[:, :(vocab + 31) // 32].contiguous())
            before = logits.clone()
            got = lab.apply_grammar_mask(logits, bitmask)
            what = f"the mask of {rows} rows over {vocab} tokens ({logits.dtype})"
            assert_close(got, expected, what, atol=0, rtol=0)
            assert got.dtype == logits.dtype, f"{what}: returned {got.dtype} logits"
            assert torch.equal(logits, before), "apply_grammar_mask changed the logits it was given"


@exercise("8.6")
def test_grammar_mask_fixed_cases(lab):
    """word 0b1011 keeps tokens 0, 1, 3; -2**31 keeps only token 31 (the sign bit); -1 keeps all 32; 0 none;
    float16 stays float16"""
    cases = [(0b1011, [0, 1, 3]), (-2**31, [31]), (-1, list(range(32))), (0, []), (2**30, [30])]
    for word, allowed in cases:
        got = lab.apply_grammar_mask(torch.zeros(1, 32), torch.tensor([[word]], dtype=torch.int32))
        kept = got[0].isfinite().nonzero().flatten().tolist()
        assert kept == allowed, f"bitmask word {word}: kept tokens {kept}, expected {allowed}"
        assert (got[0][~got[0].isfinite()] == -math.inf).all(), "forbidden tokens must be -inf"
    half = lab.apply_grammar_mask(torch.ones(2, 40, dtype=torch.float16), torch.tensor([[1, 1], [0, 2]],
                                                                                        dtype=torch.int32))
    assert half.dtype == torch.float16, f"float16 logits came back as {half.dtype}"
    assert half[0].isfinite().nonzero().flatten().tolist() == [0, 32] and \
        half[1].isfinite().nonzero().flatten().tolist() == [33], "two words per row: token 32 is bit 0 of word 1"


@exercise("8.6")
def test_grammar_mask_stays_on_the_logits_device(lab):
    """the logits on another device than the bitmask (the engine fills the bitmask on the CPU while the logits sit
    on the accelerator; here the logits are on PyTorch's 'meta' device, so no GPU is needed): the result is on the
    logits' device, with their shape and dtype, and nothing of the CPU is mixed into a computation on that device;
    likewise with both on 'meta'"""
    for where in ("bitmask on the CPU", "bitmask on 'meta' too"):
        logits = torch.zeros(3, 70, dtype=torch.float16, device="meta")
        bitmask = torch.tensor([[1, 1, 5], [0, 2, -1], [-1, -1, -2**31]], dtype=torch.int32)
        if where != "bitmask on the CPU":
            bitmask = bitmask.to("meta")
        try:
            got = lab.apply_grammar_mask(logits, bitmask)
        except RuntimeError as e:
            raise AssertionError(f"Exercise 8.6: logits on the 'meta' device, {where}: the mask mixed tensors of two "
                                 f"devices ({str(e).splitlines()[0]}): a tensor it builds must be on the device of "
                                 f"the tensor it is combined with") from None
        assert isinstance(got, torch.Tensor) and got.device == logits.device, \
            f"Exercise 8.6: logits on 'meta', {where}: the result is on {getattr(got, 'device', got)}, not 'meta'"
        assert got.shape == logits.shape and got.dtype == logits.dtype, \
            f"Exercise 8.6: logits [3, 70] float16 on 'meta': the result is {list(got.shape)} {got.dtype}"


# -- 8.7 cost_per_million_tokens -------------------------------------------------------------------------
@exercise("8.7")
def test_cost_per_million_tokens_fixed_cases(lab):
    """$3.60/h at 1 token/s is $1000 per million; $2.50/h at 2500 tok/s is $0.2778; $0/h is free; tokens/s <= 0
    or NaN raises ValueError"""
    for price, rate, want in ((3.6, 1.0, 1000.0), (2.5, 2500.0, 2.5 / 9e6 * 1e6), (0.0, 10.0, 0.0), (36.0, 1e4, 1.0)):
        got = lab.cost_per_million_tokens(price, rate)
        assert math.isclose(got, want, rel_tol=1e-12), f"cost_per_million_tokens({price}, {rate}) = {got}, " \
                                                       f"expected {want}"
    for args in ((1.0, 0.0), (1.0, -5.0), (1.0, math.nan), (2.0, -math.inf)):
        with pytest.raises(ValueError):
            got = lab.cost_per_million_tokens(*args)
            raise AssertionError(f"cost_per_million_tokens{args} returned {got}; expected a ValueError")


@exercise("8.7")
def test_cost_per_million_tokens_on_random_prices(lab):
    """200 seeded (price, throughput) pairs: the reference's dollars per million tokens, inversely proportional to
    throughput"""
    rng = random.Random(807)
    for _ in range(200):
        price, rate = rng.uniform(0.01, 100), 10 ** rng.uniform(-1, 5)
        got = lab.cost_per_million_tokens(price, rate)
        assert math.isclose(got, price / (3600 * rate) * 1e6, rel_tol=1e-9), \
            f"cost_per_million_tokens({price}, {rate}) = {got}, expected {price / (3600 * rate) * 1e6}"


# -- 8.8 LoopBreaker ------------------------------------------------------------------------------------
RULES = ("repeat", "tokens", "calls")


def kind(reason: str | None) -> str | None:
    """The rule a reason names: the contract asks only that the reason start with the rule's name (any
    wording after it); a reason that starts with none of them is returned whole, to be shown as it is."""
    if reason is None:
        return None
    text = str(reason).strip()
    return next((rule for rule in RULES if text.lower().startswith(rule)), text)


@exercise("8.8")
def test_breaker_fixed_cases(lab):
    """each rule fires at its boundary: the 3rd call of max_calls 3, the call that brings tokens to max_tokens,
    the 2nd copy (numbers and case normalised) within a window of 2, a whole window of copies; repeat before tokens
    before calls; two breakers side by side keep their own counts and caps; caps that are not integers >= 1
    (zero, negative, float, NaN) or max_repeats past the window raise ValueError"""
    b = lab.LoopBreaker(max_calls=3, max_tokens=1000, repeat_window=2, max_repeats=2)
    assert [kind(b.check(t, 10)) for t in ("a", "b", "c")] == [None, None, "calls"], "max_calls 3: stop on call 3"
    b = lab.LoopBreaker(max_calls=10, max_tokens=100, repeat_window=3, max_repeats=3)
    assert [kind(b.check(t, 40)) for t in ("a", "b", "c")] == [None, None, "tokens"], "40 + 40 + 40 reaches 100"
    b = lab.LoopBreaker(max_calls=10, max_tokens=100, repeat_window=3, max_repeats=3)
    assert [kind(b.check(t, 50)) for t in ("a", "b")] == [None, "tokens"], "50 + 50 reaches 100 exactly: stop"
    b = lab.LoopBreaker(max_calls=10, max_tokens=10_000, repeat_window=2, max_repeats=2)
    assert kind(b.check("Call search(page=1)", 1)) is None
    assert kind(b.check("call  SEARCH(page=2)", 1)) == "repeat", "the same call with another number is a repeat"
    b = lab.LoopBreaker(max_calls=10, max_tokens=10_000, repeat_window=2, max_repeats=2)
    assert [kind(b.check(t, 1)) for t in ("x", "y", "x", "y")] == [None] * 4, "repeats outside a window of 2"
    b = lab.LoopBreaker(max_calls=2, max_tokens=5, repeat_window=2, max_repeats=2)
    assert [kind(b.check("same", 3)) for _ in range(2)] == [None, "repeat"], "all three fire: repeat comes first"
    b = lab.LoopBreaker(max_calls=2, max_tokens=5, repeat_window=2, max_repeats=2)
    assert [kind(b.check(t, 3)) for t in ("p", "q")] == [None, "tokens"], "tokens and calls fire: tokens first"
    b = lab.LoopBreaker(max_calls=10, max_tokens=10_000, repeat_window=3, max_repeats=3)
    assert [kind(b.check("same", 1)) for _ in range(3)] == [None, None, "repeat"], \
        "max_repeats equal to repeat_window: the whole window the same output"
    short, long = (lab.LoopBreaker(max_calls=n, max_tokens=10_000, repeat_window=2, max_repeats=2) for n in (2, 5))
    got = [kind(b.check(t, 1)) for t in ("a", "b") for b in (short, long)]
    assert got == [None, None, "calls", None], \
        f"two breakers (max_calls 2 and 5) called in turn: {got}; each must count its own calls with its own caps"
    refused = [(0, 1, 1, 1), (1, 0, 1, 1), (1, 1, 0, 1), (1, 1, 1, 0), (1, 1, 2, 3), (-3, 5, 2, 1), (5, -1, 2, 1),
               (2.5, 10, 2, 1), (5, 10, 3, 1.5), (5, math.nan, 2, 1), (5, 10, 3, 4)]
    for caps in refused:
        with pytest.raises(ValueError):
            lab.LoopBreaker(*caps)
            raise AssertionError(f"LoopBreaker{caps} was accepted; expected a ValueError")


@exercise("8.8")
def test_breaker_matches_the_reference_on_random_sessions(lab):
    """100 seeded sessions of up to 30 calls (outputs from a small alphabet, so that repeats occur, with numbers
    and case varied) stop on the same call, for the same rule, as the engine's LoopBreaker"""
    rng = random.Random(808)
    for session in range(100):
        caps = dict(max_calls=rng.randint(1, 25), max_tokens=rng.randint(1, 3000), repeat_window=rng.randint(1, 6))
        caps["max_repeats"] = rng.randint(1, caps["repeat_window"])
        mine, reference = lab.LoopBreaker(**caps), LoopBreaker(**caps)
        for call in range(30):
            output = rng.choice(["Search(q)", "search(Q)", "read file 7", "READ  file 12", "done?", "think"])
            tokens = rng.randint(0, 200)
            got, want = mine.check(output, tokens), reference.check(output, tokens)
            assert kind(got) == kind(want), (f"session {session} {caps}, call {call + 1} ({output!r}, {tokens} "
                                             f"tokens): your breaker said {got!r} (rule {kind(got)!r}), the "
                                             f"reference {want!r} (rule {kind(want)!r})")
            if want is not None:
                break


# -- 8.E your parts in the real serving stack -------------------------------------------------------------
async def flood(base_url: str, count: int) -> list[httpx.Response]:
    body = {"model": "tiny", "prompt": "def f(x):", "max_tokens": 24, "temperature": 0, "ignore_eos": True}
    async with httpx.AsyncClient(timeout=120) as client:
        return await asyncio.gather(*(client.post(base_url + "/v1/completions", json=body) for _ in range(count)))


@exercise("8.E", timeout=120)
def test_your_admission_answers_429_with_your_retry_after_in_the_real_server(lab):
    ("the server with your admit (max_waiting 2, one running sequence) flooded with 8 requests: every decision "
     "equals the reference's on the same queue, the refused requests get 429 with your Retry-After, the rest 200")
    parts = lab_parts(lab, "08")
    decisions = []

    def recording(num_waiting: int, max_waiting: int, drain_rate: float):
        retry = parts["admit"](num_waiting, max_waiting, drain_rate)
        decisions.append(((num_waiting, max_waiting, drain_rate), retry))
        return retry

    with one_thread(), serve_in_thread(LLM("tiny", max_num_seqs=1), max_waiting=2, admission=recording) as server:
        responses = run_async(flood(server.base_url, 8))
    for args, retry in decisions:
        want = admit(*args)
        assert (retry is None) == (want is None) and (retry is None or math.isclose(retry, want)), \
            f"admit{args} = {retry} inside the server, the reference says {want}"
    refused = [r for r in responses if r.status_code == 429]
    assert refused, f"no request was refused: the flood never filled the queue ({decisions})"
    assert all(r.status_code in (200, 429) for r in responses), [r.text for r in responses]
    headers = sorted(int(r.headers["Retry-After"]) for r in refused)
    assert headers == sorted(math.ceil(retry) for _, retry in decisions if retry is not None), \
        f"Retry-After headers {headers}, your admit returned {[retry for _, retry in decisions]}"


LOAD = dict(n=8, rate=20.0, seed=3, burstiness=0.5)
SLO = {"ttft": 1.0, "tpot": 0.1}


def load_test(**parts):
    """LOAD's requests through the load generator (with these parse_sse / arrivals) against a fresh server."""
    items = make_workload(LOAD["n"], seed=1, prompt_len=16, output_len=6)
    with one_thread(), serve_in_thread(LLM("tiny")) as server:
        return run_async(run_load(server.base_url, items, rate=LOAD["rate"], burstiness=LOAD["burstiness"],
                                    seed=LOAD["seed"], ignore_eos=True, progress=False, **parts))


@functools.cache
def reference_load():
    """The load test with the reference parts, once per grader process."""
    return load_test()


@exercise("8.E", timeout=180)
def test_your_sse_parser_and_arrivals_drive_the_real_load_generator(lab):
    ("the load generator with your parse_sse and arrival_times against a live server: your arrivals equal the "
     "engine's, requests start in their order, every request succeeds with the token and chunk counts of a run "
     "with the reference parts, and your request_metrics and goodput give the reference figures on its records")
    parts = lab_parts(lab, "08")
    n, rate, seed, k = LOAD.values()
    times = parts["arrival_times"](n, rate, seed, k)
    assert np.allclose(times, arrival_times(n, rate, seed, k)), \
        f"your arrival_times{(n, rate, seed, k)} = {times}, the engine's {arrival_times(n, rate, seed, k)}"
    mine, reference = load_test(parse_sse=parts["parse_sse"], arrivals=parts["arrival_times"]), reference_load()
    for i, (m, r) in enumerate(zip(mine.records, reference.records)):
        assert r.success, f"the reference run's request {i} failed: {r.error}"
        assert m.success, f"request {i} failed with your parse_sse: {m.error}"
        assert (m.output_tokens, len(m.chunk_times)) == (r.output_tokens, len(r.chunk_times)), \
            (f"request {i}: {m.output_tokens} tokens in {len(m.chunk_times)} chunks with your parse_sse, "
             f"{r.output_tokens} in {len(r.chunk_times)} with the reference")
    started = sorted(range(n), key=lambda i: mine.records[i].start)
    assert started == sorted(range(n), key=lambda i: times[i]), \
        f"the requests started in the order {started}, not in the order of their arrival times {times}"
    for i, record in enumerate(mine.records):
        got, want = parts["request_metrics"](record), request_metrics(record)
        assert np.allclose([got.ttft, got.e2e, got.tpot], [want.ttft, want.e2e, want.tpot]) and \
            np.allclose(got.itl, want.itl), f"request {i}: your request_metrics {got}, the reference {want}"
    got, want = parts["goodput"](mine.records, mine.duration, SLO), goodput(mine.records, mine.duration, SLO)
    assert math.isclose(got, want), f"goodput under {SLO}: yours {got}, the reference {want}"


SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6}, "size": {"type": "integer"}},
     "required": ["name", "size"]},
    {"type": "object", "properties": {"ok": {"type": "boolean"}, "color": {"enum": ["red", "green", "blue"]}},
     "required": ["ok", "color"]},
]


MASK_PROMPTS = ["config = ", "def main():", "settings = "]
MASK_PARAMS = [SamplingParams(max_tokens=40, temperature=0, structured=StructuredOutput(json_schema=SCHEMAS[0])),
               SamplingParams(max_tokens=12, temperature=0),
               SamplingParams(max_tokens=40, temperature=0, structured=StructuredOutput(json_schema=SCHEMAS[1]))]


@functools.cache
def reference_outputs() -> list:
    """The reference engine's outputs, once per grader process (the negatives' runs reuse them)."""
    with one_thread():
        return LLM("tiny").generate(MASK_PROMPTS, MASK_PARAMS, use_tqdm=False)


@exercise("8.E", timeout=120)
def test_your_grammar_mask_runs_the_real_engine(lab):
    ("tiny with your grammar mask generates the reference engine's greedy tokens for two schema-constrained "
     "requests batched with a free one, and both outputs validate against their schemas (jsonschema)")
    components = lab_components(lab, labs=["08"])
    prompts, want = MASK_PROMPTS, reference_outputs()
    with one_thread():
        got = LLM("tiny", components=components).generate(MASK_PROMPTS, MASK_PARAMS, use_tqdm=False)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.token_ids == w.token_ids, (f"request {i} ({prompts[i]!r}): the engine with your mask generated "
                                            f"{g.text!r}, the reference engine {w.text!r}")
    for out, schema in ((got[0], SCHEMAS[0]), (got[2], SCHEMAS[1])):
        jsonschema.validate(json.loads(out.text), schema)
    assert calls(components)["grammar_mask"] > 0, "the engine never called your apply_grammar_mask"


class Recording:
    """The learner's breaker, asked beside the reference on every call the harness makes."""

    def __init__(self, make, caps: dict, seen: list) -> None:
        self.mine, self.reference, self.seen = make(**caps), LoopBreaker(**caps), seen

    def check(self, output: str, tokens: int) -> str | None:
        got = self.mine.check(output, tokens)
        self.seen.append((output, tokens, got, self.reference.check(output, tokens)))
        return got


@exercise("8.E", timeout=120)
def test_your_loop_breaker_stops_the_real_agent_harness(lab):
    ("the agent harness with your LoopBreaker (one per session) on six seeded sessions: on every call it makes, "
     "your breaker's decision equals the reference's, and the sessions end where your breaker said")
    parts = lab_parts(lab, "08")
    caps = dict(max_calls=4, max_tokens=900, repeat_window=3, max_repeats=2)
    seen = []
    with one_thread():
        llm = LLM("tiny", max_num_seqs=6)
        corpus = llm.tokenizer.encode("x = 1\nprint(x)\n" * 40 + "def f(a, b):\n    return a + b\n" * 20)
        workload = agent_workload(corpus, num_sessions=6, seed=8, system_tokens=24, task_tokens=8, tool_tokens=8,
                                  tool_seconds=0.005, median_calls=6)
        run = run_sessions(llm, workload, max_tokens=4, breaker=lambda: Recording(parts["LoopBreaker"], caps, seen))
    for output, tokens, yours, reference in seen:
        assert kind(yours) == kind(reference), (
            f"Exercise 8.8 in the agent harness: a call of {tokens} tokens that output {output!r}: your breaker "
            f"said {yours!r} (rule {kind(yours)!r}), the reference breaker {reference!r} (rule {kind(reference)!r})")
    stops = [reason for reason in run.stop_reasons.values() if reason not in ("done", "context")]
    assert stops, f"no session was stopped by the breaker: {run.stop_reasons}"
    yours_stops = [yours for _, _, yours, _ in seen if yours is not None]  # what the learner's breaker returned
    assert sorted(map(str, stops)) == sorted(map(str, yours_stops)), \
        (f"Exercise 8.8 in the agent harness: the harness ended sessions for {sorted(map(str, stops))}, but your "
         f"breaker asked to stop with {sorted(map(str, yours_stops))}")
