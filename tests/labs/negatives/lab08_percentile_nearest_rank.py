"""Returns the nearest rank's value without interpolating between the two closest ranks."""
EXERCISE = "8.3"


def percentile(values, q):
    if not values:
        return math.nan
    xs = sorted(values)
    return xs[round(q / 100 * (len(xs) - 1))]
