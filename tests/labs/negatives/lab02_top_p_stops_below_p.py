"""Keeps tokens only while the running sum stays below p, so the token that reaches p is dropped."""
EXERCISE = "2.4"


def top_p_filter(logits, p):
    if p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    drop_sorted = sorted_logits.softmax(-1).cumsum(-1) >= p
    drop_sorted[:, 0] = False
    drop = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))
