"""Returns the proposals as a tensor [B, k] instead of lists of Python ints (the engine's callers index lists)."""
EXERCISE = "5.7"


def propose_heads(hidden, blocks, lm_head, k):
    if not 0 <= k <= len(blocks):
        raise ValueError(f"k = {k}, {len(blocks)} heads")
    if k == 0:
        return [[] for _ in range(len(hidden))]
    return lm_head(torch.stack([hidden + F.silu(block(hidden)) for block in blocks[:k]], dim=1)).argmax(-1)
