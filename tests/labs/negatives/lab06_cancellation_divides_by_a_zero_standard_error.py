"""Compares the t statistic mean / se with -z: dividing by a standard error of 0 fails."""
EXERCISE = "6.7"


def find_cancellations(errors, z=2.0):
    found = []
    for s in errors:
        for a in errors:
            b = s - a
            if not (a and a < s and min(s) in a and b in errors):
                continue
            d = [x - y - w for x, y, w in zip(errors[s], errors[a], errors[b])]
            mean = sum(d) / len(d)
            se = math.sqrt(sum((v - mean) ** 2 for v in d) / (len(d) - 1)) / math.sqrt(len(d))
            if mean / se < -z:
                found.append((mean, a, b))
    return [(a, b) for _, a, b in sorted(found, key=lambda f: f[0])]
