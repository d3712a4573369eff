"""Reports a pair when mean(d) <= -z * se: a mean exactly on the threshold counts as cancelling."""
EXERCISE = "6.7"


def find_cancellations(errors, z=2.0):
    found = []
    for s in errors:
        for a in errors:
            b = s - a
            if not (a and a < s and min(s) in a and b in errors):
                continue
            d = torch.tensor(errors[s], dtype=torch.float64) - torch.tensor(errors[a], dtype=torch.float64) \
                - torch.tensor(errors[b], dtype=torch.float64)
            if d.mean() <= -z * d.std() / math.sqrt(len(d)):
                found.append((float(d.mean()), a, b))
    return [(a, b) for _, a, b in sorted(found, key=lambda f: f[0])]
