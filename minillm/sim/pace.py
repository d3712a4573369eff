"""A machine's pace persists: one slow step is followed by more.

Real steps stray from their price (a profile's `spread`), and not independently: when the machine is
slow (another process on the core, a cold cache, a throttled clock) it stays slow for a while. Measured
on this engine, the ratios of consecutive steps correlate about 0.6-0.8, and steps 10 apart still
0.2-0.6. A request's TPOT averages its steps, so independent draws average the slowness away and predict
the TPOT tail short; correlated draws keep the slow spells that make it.

The model is the simplest that keeps both the measured spread and the correlation: a pace z, a standard
normal score that follows an AR(1) process from step to step,

    z' = rho z + sqrt(1 - rho^2) e,    e ~ N(0, 1)

and each step's ratio is the spread's quantile at Phi(z') (a Gaussian copula). Whatever rho, every step
alone follows the measured spread; rho = 0 draws each step afresh. `persistence` fits rho so that the
mean correlation over lags 1..LAGS matches the measured steps' (their ratios as normal scores): the lags
over which a request's TPOT averages its steps.
"""
import math
import random
import statistics

LAGS = 32  # the steps a persistence fit looks back over: about the output length of a request
NORMAL = statistics.NormalDist()


def normal_scores(values: list[float]) -> list[float]:
    """Each value's rank as a standard normal score: the k-th smallest of n -> Phi^-1((k + 1/2) / n)."""
    order = sorted(range(len(values)), key=values.__getitem__)
    scores = [0.0] * len(values)
    for rank, i in enumerate(order):
        scores[i] = NORMAL.inv_cdf((rank + 0.5) / len(values))
    return scores


def autocorrelation(z: list[float], lag: int) -> float:
    """The correlation of z with itself `lag` steps later (z has mean 0: normal scores)."""
    a, b = z[:-lag], z[lag:]
    norm = math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))
    return sum(x * y for x, y in zip(a, b)) / norm if norm else 0.0


def persistence(ratios: list[float], lags: int = LAGS) -> float:
    """rho of the AR(1) pace whose mean correlation over lags 1..lags equals that of the ratios, in step order
    (0 when they do not correlate positively; fewer than 2 * lags ratios: 0, too few to tell)."""
    if len(ratios) < 2 * lags:
        return 0.0
    z = normal_scores(ratios)
    target = statistics.fmean(autocorrelation(z, lag) for lag in range(1, lags + 1))
    lo, hi = 0.0, 0.999  # the AR(1)'s mean correlation rises with rho: bisect
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if statistics.fmean(mid ** lag for lag in range(1, lags + 1)) < target else (lo, mid)
    return lo


def next_pace(z: float, rho: float, rng: random.Random) -> float:
    """The pace after one more step: rho z + sqrt(1 - rho^2) e (a standard normal again)."""
    return rho * z + math.sqrt(1.0 - rho * rho) * rng.gauss(0.0, 1.0)


def at_share(table: tuple[float, ...], share: float) -> float:
    """The value of a table of equally likely values, ascending, that `share` of the draws stay under."""
    return table[min(int(share * len(table)), len(table) - 1)]


def quantile(table: tuple[float, ...], z: float) -> float:
    """The table's value at the pace's normal quantile Phi(z)."""
    return at_share(table, NORMAL.cdf(z))
