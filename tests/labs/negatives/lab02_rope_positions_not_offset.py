"""Gives new tokens positions 0..n-1 instead of continuing after the cache."""
EXERCISE = "2.2"


def forward_step(model, token_ids, cache):
    positions = torch.arange(token_ids.shape[0])
    with torch.no_grad():
        logits = model.compute_logits(model(token_ids, positions, cache))
    cache.length += token_ids.shape[0]
    return logits
