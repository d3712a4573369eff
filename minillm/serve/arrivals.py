"""When the requests of a load test arrive: a Poisson process, or a burstier gamma process.

Real traffic comes from many independent users, so the gaps between requests are close to
exponential (a Poisson process, coefficient of variation 1). Bursty traffic (retries, batch jobs,
agents fanning out) is modelled with gamma gaps of shape k < 1: the same mean gap 1/rate, but a
coefficient of variation 1/sqrt(k) > 1, i.e. clumps of requests and long quiet spells between.
This is vLLM's benchmark convention (`--request-rate`, `--burstiness`).
"""
import math

import numpy as np


def arrival_times(n: int, rate: float, seed: int, burstiness: float = 1.0) -> list[float]:
    """Seconds from the start of the test at which each of n requests is sent, ascending.

    gaps g_i ~ Gamma(shape=burstiness, scale=1 / (rate * burstiness)): mean 1/rate, variance
    1 / (burstiness * rate^2). Shape 1 is the exponential, so burstiness=1 is a Poisson process.
    times t_i = g_1 + ... + g_i (the first request, too, waits one gap).
    rate = inf sends every request at t=0 (the offline, all-at-once load).
    """
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be an integer >= 0, got {n!r}")
    if not rate > 0:
        raise ValueError(f"rate must be > 0 requests/s (inf: all at once), got {rate!r}")
    if not (burstiness > 0 and math.isfinite(burstiness)):
        raise ValueError(f"burstiness must be a finite number > 0 (1: Poisson, < 1: burstier), got {burstiness!r}")
    if math.isinf(rate):
        return [0.0] * n
    gaps = np.random.default_rng(seed).gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n)
    return np.cumsum(gaps).tolist()
