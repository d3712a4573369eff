"""Treats top_p > 1 as an error instead of 'keep everything', as the exercise text allows."""
EXERCISE = "2.4"


def top_p_filter(logits, p):
    if p > 1.0:
        raise ValueError(f"top_p must be at most 1, got {p}")
    if p == 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = sorted_logits.softmax(-1)
    drop = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, order, probs.cumsum(-1) - probs >= p)
    return logits.masked_fill(drop, float("-inf"))
