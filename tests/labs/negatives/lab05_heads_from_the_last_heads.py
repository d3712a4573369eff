"""Takes the last k heads instead of the first k: the guesses of the farthest positions."""
EXERCISE = "5.7"


def propose_heads(hidden, blocks, lm_head, k):
    if not 0 <= k <= len(blocks):
        raise ValueError(f"k = {k}, {len(blocks)} heads")
    if k == 0:
        return [[] for _ in range(len(hidden))]
    chosen = list(blocks)[len(blocks) - k:]
    return lm_head(torch.stack([hidden + F.silu(block(hidden)) for block in chosen], dim=1)).argmax(-1).tolist()
