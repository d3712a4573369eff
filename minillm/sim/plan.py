"""Reading a simulation: the serving figures of its requests, and capacity planning on paper.

The figures are the load generator's (minillm/perf/serving.py): a simulated request becomes a
RequestRecord whose chunks are its tokens, so a simulation and a real load test print alike.
A profile with a measured spread makes each run one draw of the step times: `predict` gives the
median figures of several.
"""
import statistics

from minillm.perf.serving import RequestRecord, summarize
from minillm.sim.replica import SimRequest, copies
from minillm.sim.simulate import simulate
from minillm.sim.step_profile import StepProfile


def records(requests: list[SimRequest]) -> list[RequestRecord]:
    return [RequestRecord(r.request_id, r.arrival, list(r.token_times), r.token_times[-1], r.prompt_tokens,
                          len(r.token_times), success=True) for r in requests]


def summary(requests: list[SimRequest], slo: dict[str, float] | None = None) -> dict:
    """summarize() over the simulated requests, from the first arrival to the last token, plus the share of
    prompt tokens the prefix caches supplied."""
    start = min(r.arrival for r in requests)
    end = max(r.token_times[-1] for r in requests)
    out = summarize(records(requests), end - start, slo)
    out["prefix_hit_rate"] = sum(r.cached_tokens for r in requests) / max(sum(r.prompt_tokens for r in requests), 1)
    return out


SEEDS = 5  # simulations `predict` runs of a profile with a spread


def predict(requests: list[SimRequest], profile: StepProfile, seeds: int = SEEDS, **options) -> dict:
    """summary() of `requests` simulated (simulate's options), each figure the median of `seeds` runs, each
    drawing its own step times from the profile's spread (one run of a profile without one: it is exact).
    The requests are copied, so one workload can be predicted many times."""
    runs = []
    for seed in range(seeds if profile.spread else 1):
        runs.append(summary(simulate(copies(requests), profile, seed=seed, **options).requests))
    return {key: statistics.median(run[key] for run in runs) if isinstance(value, (int, float)) else value
            for key, value in runs[0].items()}


def replicas_needed(make_workload, profile: StepProfile, slo: dict[str, float], attainment: float = 0.99,
                    router: str = "least_loaded", limit: int = 1024, **replica_options) -> tuple[int, dict]:
    """The fewest replicas whose simulated run meets slo for `attainment` of the requests; -> (replicas, its
    summary). make_workload() -> (requests, sessions), fresh each call. Doubles, then bisects."""
    def meets(n: int) -> tuple[bool, dict]:
        requests, sessions = make_workload()
        result = simulate(requests, profile, replicas=n, router=router, sessions=sessions, **replica_options)
        s = summary(result.requests, slo)
        return s["slo_attainment"] >= attainment, s

    hi = 1
    ok, best = meets(hi)
    while not ok:
        if hi >= limit:
            raise ValueError(f"even {limit} replicas miss the SLO {slo} (attainment {best['slo_attainment']:.1%})")
        hi *= 2
        ok, best = meets(hi)
    lo = hi // 2  # misses (or 0)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        ok, s = meets(mid)
        lo, hi, best = (lo, mid, s) if ok else (mid, hi, best)
    return hi, best



