"""Checks none of its arguments: a rate of 0 divides by zero, a negative rate or burstiness reaches numpy."""
EXERCISE = "8.4"


def arrival_times(n, rate, seed, burstiness=1.0):
    if math.isinf(rate):
        return [0.0] * n
    gaps = np.random.default_rng(seed).gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n)
    return np.cumsum(gaps).tolist()
