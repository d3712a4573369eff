"""The right proposal, but no check of k (a k beyond the heads gives fewer proposals) and k = 0 crashes."""
EXERCISE = "5.7"


def propose_heads(hidden, blocks, lm_head, k):
    guesses = torch.stack([hidden + F.silu(block(hidden)) for block in blocks[:k]], dim=1)
    return lm_head(guesses).argmax(-1).tolist()
