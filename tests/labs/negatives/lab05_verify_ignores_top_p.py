"""Filters the target with temperature and top-k but never top-p."""
EXERCISE = "5.3"


def verify(logits, proposals, q, temperature, top_k, top_p, generator):
    k = len(proposals)
    if temperature == 0:
        best = logits.argmax(-1).tolist()
        accepted = next((i for i in range(k) if proposals[i] != best[i]), k)
        return accepted, best[accepted]
    p = target_probs(logits, temperature, top_k, 1.0)
    for i, x in enumerate(proposals):
        q_i = q[i] if q is not None else F.one_hot(torch.tensor(x), p.shape[-1]).to(p)
        if not accept(float(p[i, x]), float(q_i[x]), generator):
            return i, int(torch.multinomial(residual(p[i], q_i), 1, generator=generator))
    return k, int(torch.multinomial(p[k], 1, generator=generator))
