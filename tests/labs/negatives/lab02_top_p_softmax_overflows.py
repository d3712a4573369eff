"""Computes the probabilities as exp(z) / sum(exp(z)) without subtracting the maximum: NaN once
logits pass ~88, as low temperatures make them."""
EXERCISE = "2.4"


def top_p_filter(logits, p):
    if p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    weights = sorted_logits.exp()
    probs = weights / weights.sum(-1, keepdim=True)
    before = probs.cumsum(-1) - probs
    drop = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, order, before >= p)
    return logits.masked_fill(drop, float("-inf"))
