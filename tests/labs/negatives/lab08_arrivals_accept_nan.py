"""Checks `rate <= 0` and `burstiness <= 0`, both False for NaN: a NaN rate or burstiness gives NaN times."""
EXERCISE = "8.4"


def arrival_times(n, rate, seed, burstiness=1.0):
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be an integer >= 0, got {n!r}")
    if rate <= 0:
        raise ValueError(f"rate must be > 0, got {rate!r}")
    if burstiness <= 0 or math.isinf(burstiness):
        raise ValueError(f"burstiness must be a finite number > 0, got {burstiness!r}")
    if math.isinf(rate):
        return [0.0] * n
    gaps = np.random.default_rng(seed).gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n)
    return np.cumsum(gaps).tolist()
