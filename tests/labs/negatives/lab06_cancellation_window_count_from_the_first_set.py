"""Reads the number of windows from the first measured set before looking at anything: fails when none is."""
EXERCISE = "6.7"


def find_cancellations(errors, z=2.0):
    n = len(next(iter(errors.values())))
    found = []
    for s in errors:
        for a in errors:
            b = s - a
            if not (a and a < s and min(s) in a and b in errors):
                continue
            d = [x - y - w for x, y, w in zip(errors[s], errors[a], errors[b])]
            mean = sum(d) / n
            se = math.sqrt(sum((v - mean) ** 2 for v in d) / (n - 1)) / math.sqrt(n)
            if mean < -z * se:
                found.append((mean, a, b))
    return [(a, b) for _, a, b in sorted(found, key=lambda f: f[0])]
