"""Tests each set's mean error on its own (independent standard errors), not the window-by-window interaction."""
EXERCISE = "6.7"


def find_cancellations(errors, z=2.0):
    def mean_and_se(values):
        t = torch.tensor(values, dtype=torch.float64)
        return float(t.mean()), float(t.std()) / math.sqrt(len(t))

    found = []
    for s in errors:
        for a in errors:
            b = s - a
            if not (a and a < s and min(s) in a and b in errors):
                continue
            (ms, ss), (ma, sa), (mb, sb) = mean_and_se(errors[s]), mean_and_se(errors[a]), mean_and_se(errors[b])
            d = ms - ma - mb
            if d < -z * math.sqrt(ss ** 2 + sa ** 2 + sb ** 2):
                found.append((d, a, b))
    return [(a, b) for _, a, b in sorted(found, key=lambda f: f[0])]
