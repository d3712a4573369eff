"""Reads token t at bit 31 - (t % 32) of its word: the bits in the wrong order."""
EXERCISE = "8.6"


def apply_grammar_mask(logits, bitmask):
    vocab = logits.shape[-1]
    bits = 31 - torch.arange(32, dtype=torch.int32)
    allowed = ((bitmask.unsqueeze(-1) >> bits) & 1).reshape(bitmask.shape[0], -1)[:, :vocab].bool()
    return logits.masked_fill(~allowed, float("-inf"))
