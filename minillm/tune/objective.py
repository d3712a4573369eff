"""What a search maximizes, as pure functions over measured (or simulated) figures.

    goodput_objective(latencies, duration, slo)   requests a second meeting every SLO
    pareto_front(points, maximize, minimize)      the points no other point beats on every axis
    cost_per_million(price_per_hour, tokens_s)    $ per 1M output tokens, interactive or batch

A latency is a dict {"ttft": s, "tpot": s or None, "e2e": s} of one request (perf/serving.py's
definitions). Lab 10 has the learner write these; `tune` takes theirs as keyword arguments.
"""
from minillm.perf.cost import cost_per_million_tokens


def goodput_objective(latencies: list[dict], duration: float, slo: dict[str, float]) -> float:
    """Requests per second (over `duration` seconds) whose every metric named in slo is at most its limit:
    a value exactly at the limit meets it, and a TPOT of None (one output token) meets any TPOT limit.
    An empty slo: every request counts (the throughput in requests/s)."""
    if duration <= 0:
        raise ValueError(f"duration must be > 0 seconds, got {duration}")
    good = sum(all(r[name] is None or r[name] <= limit for name, limit in slo.items()) for r in latencies)
    return good / duration


def dominates(a: dict, b: dict, maximize: str, minimize: tuple[str, ...]) -> bool:
    """a is at least as good as b on every axis and better on one."""
    no_worse = a[maximize] >= b[maximize] and all(a[m] <= b[m] for m in minimize)
    better = a[maximize] > b[maximize] or any(a[m] < b[m] for m in minimize)
    return no_worse and better


def pareto_front(points: list[dict], maximize: str = "goodput",
                 minimize: tuple[str, ...] = ("ttft_p99", "memory_mb")) -> list[dict]:
    """The points that no other point dominates, in their given order; equal points are all kept (neither
    dominates the other)."""
    return [p for p in points if not any(dominates(q, p, maximize, minimize) for q in points)]


def cost_per_million(price_per_hour: float, tokens_per_second: float) -> float:
    """$ per 1M output tokens of a machine at price_per_hour that makes tokens_per_second: interactive
    serving counts only the tokens of requests meeting the SLO, a batch job all of them."""
    return cost_per_million_tokens(price_per_hour, tokens_per_second)
