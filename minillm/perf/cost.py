"""What a million output tokens cost: the same hardware serving online under an SLO, or offline in batch.

A machine rented at P $/hour that produces T output tokens/s costs

    $ / 1M output tokens = P / (3600 * T) * 1e6

Online serving cannot run the machine at its full throughput: past some load the queue grows and
latencies break the service-level objective, and a token that arrives too late is not worth
selling. So online T is the best "good" throughput of a sweep over request rates: the output
tokens/s of the requests that met every SLO, at the rate where that is highest. A batch job has
no latency target: every request is in the engine at once and T is the machine's full
throughput. The ratio of the two is what providers' batch discounts (about 2x) pass on.
"""

# A 2-vCPU on-demand cloud VM (AWS c7i.large in us-east-1 lists at about $0.089/hour): the kind of
# machine these CPU figures come from. Pass the price of your own hardware for its numbers.
DEFAULT_PRICE_PER_HOUR = 0.089


def cost_per_million_tokens(price_per_hour: float, tokens_per_second: float) -> float:
    """$ per 1M output tokens of hardware at price_per_hour producing tokens_per_second."""
    if tokens_per_second <= 0:
        raise ValueError(f"tokens_per_second must be > 0, got {tokens_per_second}")
    return price_per_hour / (3600 * tokens_per_second) * 1e6


def best_online_load(points: list[dict]) -> dict | None:
    """The sweep point whose requests meeting the SLO made the most output tokens/s (points:
    summarize() dicts with an slo); None when no request at any rate met it."""
    best = max(points, key=lambda p: p["good_output_throughput"], default=None)
    return best if best is not None and best["good_output_throughput"] > 0 else None


def online_vs_batch(price_per_hour: float, online_tps: float | None, batch_tps: float) -> dict:
    """Both costs per 1M output tokens and how many times cheaper batch is (None where no load met the SLO)."""
    batch = cost_per_million_tokens(price_per_hour, batch_tps)
    online = cost_per_million_tokens(price_per_hour, online_tps) if online_tps else None
    return {"price_per_hour": price_per_hour, "online_tokens_per_s": online_tps, "batch_tokens_per_s": batch_tps,
            "online_usd_per_1m": online, "batch_usd_per_1m": batch,
            "batch_cheaper_x": online / batch if online is not None else None}
