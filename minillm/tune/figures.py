"""The figures of one run, simulated or real, from its requests' token times: what the objectives read.

    {"goodput": req/s meeting the SLO, "throughput": output tokens/s, "good_tokens_s": tokens/s of the
     requests meeting it, "ttft_p99", "tpot_p99", "e2e_p99": seconds, "requests": n, "duration": s}

The duration runs from the first arrival to the last token, as sim/plan.summary counts it.
"""
from collections.abc import Callable

from minillm.perf.serving import percentile
from minillm.sim.replica import SimRequest

GoodputFn = Callable[[list[dict], float, dict], float]


def latencies(requests: list[SimRequest]) -> list[dict]:
    """Each request's {"ttft", "tpot", "e2e"} in seconds from its arrival (perf/serving.py's definitions)."""
    out = []
    for r in requests:
        ttft, e2e = r.token_times[0] - r.arrival, r.token_times[-1] - r.arrival
        out.append({"ttft": ttft, "e2e": e2e,
                    "tpot": (e2e - ttft) / (len(r.token_times) - 1) if len(r.token_times) > 1 else None})
    return out


def run_figures(requests: list[SimRequest], slo: dict[str, float], goodput_fn: GoodputFn) -> dict:
    lat = latencies(requests)
    duration = max(r.token_times[-1] for r in requests) - min(r.arrival for r in requests)
    good = [r for r, one in zip(requests, lat) if goodput_fn([one], 1.0, slo) > 0]
    tpots = [one["tpot"] for one in lat if one["tpot"] is not None]
    return {"goodput": goodput_fn(lat, duration, slo), "throughput": sum(r.output_tokens for r in requests) / duration,
            "good_tokens_s": sum(r.output_tokens for r in good) / duration,
            "ttft_p99": percentile([one["ttft"] for one in lat], 99), "tpot_p99": percentile(tpots, 99),
            "e2e_p99": percentile([one["e2e"] for one in lat], 99), "requests": len(requests), "duration": duration}
