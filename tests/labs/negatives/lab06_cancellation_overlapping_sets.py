"""Accepts any two measured sets whose union is S, overlapping ones included."""
EXERCISE = "6.7"


def find_cancellations(errors, z=2.0):
    found = []
    for s in errors:
        for a in errors:
            for b in errors:
                if not (a and b and a | b == s and a != s and b != s and min(s) in a and min(s) not in b):
                    continue
                d = torch.tensor(errors[s], dtype=torch.float64) - torch.tensor(errors[a], dtype=torch.float64) \
                    - torch.tensor(errors[b], dtype=torch.float64)
                if d.mean() < -z * d.std() / math.sqrt(len(d)):
                    found.append((float(d.mean()), a, b))
    return [(a, b) for _, a, b in sorted(found, key=lambda f: f[0])]
