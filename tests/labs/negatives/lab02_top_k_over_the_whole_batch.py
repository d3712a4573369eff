"""Keeps the k largest logits of the whole batch instead of each row's."""
EXERCISE = "2.3"


def top_k_filter(logits, k):
    if k <= 0:
        return logits
    kth = torch.topk(logits.flatten(), k).values[-1]
    return logits.masked_fill(logits < kth, float("-inf"))
