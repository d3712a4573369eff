"""After a rejection draws from the target's p instead of the residual max(0, p - q)."""
EXERCISE = "5.3"


def verify(logits, proposals, q, temperature, top_k, top_p, generator):
    k = len(proposals)
    if temperature == 0:
        best = logits.argmax(-1).tolist()
        accepted = next((i for i in range(k) if proposals[i] != best[i]), k)
        return accepted, best[accepted]
    p = target_probs(logits, temperature, top_k, top_p)
    for i, x in enumerate(proposals):
        qx = 1.0 if q is None else float(q[i, x])
        if not accept(float(p[i, x]), qx, generator):
            return i, int(torch.multinomial(p[i], 1, generator=generator))
    return k, int(torch.multinomial(p[k], 1, generator=generator))
