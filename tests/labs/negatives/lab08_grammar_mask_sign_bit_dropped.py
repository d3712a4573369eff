"""Tests each bit with (word & (1 << b)) > 0: for b = 31 that power is negative in int32, so token 31 of
every word is always forbidden."""
EXERCISE = "8.6"


def apply_grammar_mask(logits, bitmask):
    vocab = logits.shape[-1]
    powers = torch.ones(32, dtype=torch.int32) << torch.arange(32, dtype=torch.int32)
    allowed = ((bitmask.unsqueeze(-1) & powers) > 0).reshape(bitmask.shape[0], -1)[:, :vocab]
    return logits.masked_fill(~allowed, float("-inf"))
