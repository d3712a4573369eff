"""Serving metrics from a load test's per-request records: TTFT, TPOT, ITL, E2E and goodput.

The definitions of vLLM's serving benchmark (docs/design.md, Measuring), for one request sent at
`start` whose streamed chunks arrived at times c_1 < c_2 < ... < c_m and which ended at `end`:

    TTFT = c_1 - start                        time to first token: queueing + prefill
    ITL  = [c_2 - c_1, ..., c_m - c_(m-1)]    inter-token latencies: one per decode step seen
    E2E  = end - start                        the whole request
    TPOT = (E2E - TTFT) / (output_tokens - 1) time per output token after the first

Goodput is the rate of requests that meet every service-level objective (SLO) at once, e.g.
{"ttft": 0.5, "tpot": 0.05}: a server can have high throughput and low goodput when it
batches so hard that each request is slow.
"""
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

SLO_METRICS = ("ttft", "tpot", "e2e")
PERCENTILES = (50, 90, 99)


@dataclass
class RequestRecord:
    """What a client saw of one request (times in seconds on one clock, time.perf_counter)."""
    request_id: str
    start: float                                            # when the request was sent
    chunk_times: list[float] = field(default_factory=list)  # when each chunk carrying tokens arrived
    end: float | None = None                                # when the response was complete
    prompt_tokens: int = 0
    output_tokens: int = 0
    success: bool = False
    error: str = ""


class RequestMetrics(NamedTuple):
    ttft: float
    tpot: float | None  # None with a single output token: there is no time after the first
    itl: list[float]
    e2e: float


def request_metrics(record: RequestRecord) -> RequestMetrics:
    """TTFT, TPOT, ITL and E2E of one successful request (formulas in the module docstring)."""
    if not record.success or not record.chunk_times or record.end is None:
        raise ValueError(f"request {record.request_id!r} has no metrics: it needs success=True, at least one "
                         f"chunk time and an end time (success={record.success}, "
                         f"{len(record.chunk_times)} chunk times, end={record.end}, error={record.error!r})")
    ttft = record.chunk_times[0] - record.start
    e2e = record.end - record.start
    itl = [b - a for a, b in zip(record.chunk_times, record.chunk_times[1:])]
    tpot = (e2e - ttft) / (record.output_tokens - 1) if record.output_tokens > 1 else None
    return RequestMetrics(ttft, tpot, itl, e2e)


def meets_slo(metrics: RequestMetrics, slo: dict[str, float]) -> bool:
    """Whether a request meets every SLO; a value exactly at its limit meets it. A TPOT limit holds
    vacuously for a one-token request (no token came after the first)."""
    for name, limit in slo.items():
        if name not in SLO_METRICS:
            raise ValueError(f"unknown SLO {name!r}: the SLOs are {', '.join(SLO_METRICS)} (seconds)")
        value = getattr(metrics, name)
        if value is not None and value > limit:
            return False
    return True


def goodput(records: list[RequestRecord], duration: float, slo: dict[str, float]) -> float:
    """Requests per second that succeeded and met every SLO, over the test's duration (seconds)."""
    if duration <= 0:
        raise ValueError(f"duration must be > 0 seconds, got {duration}")
    return sum(r.success and meets_slo(request_metrics(r), slo) for r in records) / duration


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile, q in 0..100, by linear interpolation between the closest ranks: position
    q/100 * (n - 1) in the sorted values (numpy's default, which vLLM's serving benchmark reports).
    nan for no values. The one percentile of the package: benchmarks, simulator and app use it."""
    return float(np.percentile(values, q)) if len(values) else math.nan


def _stats(name: str, values: list[float]) -> dict[str, float]:
    out = {f"{name}_mean": sum(values) / len(values) if values else math.nan}
    out[f"{name}_median"] = percentile(values, 50)
    out.update({f"{name}_p{q}": percentile(values, q) for q in PERCENTILES if q != 50})
    return out


def summarize(records: list[RequestRecord], duration: float, slo: dict[str, float] | None = None) -> dict:
    """The load test's figures: completed / failed counts, request and token throughput (per second
    of `duration`), mean / median / p90 / p99 of TTFT, TPOT, ITL and E2E (seconds), and with `slo`
    the goodput, the output tokens/s of the requests meeting them, and their share of the completed."""
    if duration <= 0:
        raise ValueError(f"duration must be > 0 seconds, got {duration}")
    done = [r for r in records if r.success]
    metrics = [request_metrics(r) for r in done]
    output_tokens = sum(r.output_tokens for r in done)
    out = {
        "completed": len(done), "failed": len(records) - len(done), "duration_s": duration,
        "prompt_tokens": sum(r.prompt_tokens for r in done), "output_tokens": output_tokens,
        "request_throughput": len(done) / duration, "output_throughput": output_tokens / duration,
        "total_token_throughput": (output_tokens + sum(r.prompt_tokens for r in done)) / duration,
    }
    out.update(_stats("ttft", [m.ttft for m in metrics]))
    out.update(_stats("tpot", [m.tpot for m in metrics if m.tpot is not None]))
    out.update(_stats("itl", [gap for m in metrics for gap in m.itl]))
    out.update(_stats("e2e", [m.e2e for m in metrics]))
    if slo is not None:
        good = [r for r, m in zip(done, metrics) if meets_slo(m, slo)]
        out["slo"] = dict(slo)
        out["goodput"] = goodput(records, duration, slo)
        out["good_output_throughput"] = sum(r.output_tokens for r in good) / duration  # tokens that met the SLOs
        out["slo_attainment"] = len(good) / len(done) if done else 0.0
    return out
