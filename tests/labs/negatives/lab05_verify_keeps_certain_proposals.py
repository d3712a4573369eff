"""Treats a proposal made with certainty (q None) as always right when sampling: keeps it unverified."""
EXERCISE = "5.3"


def verify(logits, proposals, q, temperature, top_k, top_p, generator):
    k = len(proposals)
    if temperature == 0:
        best = logits.argmax(-1).tolist()
        accepted = next((i for i in range(k) if proposals[i] != best[i]), k)
        return accepted, best[accepted]
    p = target_probs(logits, temperature, top_k, top_p)
    for i, x in enumerate(proposals):
        if q is not None and not accept(float(p[i, x]), float(q[i, x]), generator):
            return i, int(torch.multinomial(residual(p[i], q[i]), 1, generator=generator))
    return k, int(torch.multinomial(p[k], 1, generator=generator))
