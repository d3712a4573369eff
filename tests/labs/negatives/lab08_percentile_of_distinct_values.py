"""Sorts the distinct values (sorted(set(values))): repeated values count once, so ties shift every percentile."""
EXERCISE = "8.3"


def percentile(values, q):
    if not values:
        return math.nan
    xs = sorted(set(values))
    pos = q / 100 * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)
