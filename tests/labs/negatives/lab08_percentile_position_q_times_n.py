"""Puts the q-th percentile at position q / 100 * n instead of q / 100 * (n - 1)."""
EXERCISE = "8.3"


def percentile(values, q):
    if not values:
        return math.nan
    xs = sorted(values)
    pos = min(q / 100 * len(xs), len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)
