"""Reads "chained" as each head reading the previous head's guess instead of the target's hidden state."""
EXERCISE = "5.7"


def propose_heads(hidden, blocks, lm_head, k):
    if not 0 <= k <= len(blocks):
        raise ValueError(f"k = {k}, {len(blocks)} heads")
    if k == 0:
        return [[] for _ in range(len(hidden))]
    guesses, h = [], hidden
    for block in blocks[:k]:
        h = h + F.silu(block(h))
        guesses.append(h)
    return lm_head(torch.stack(guesses, dim=1)).argmax(-1).tolist()
