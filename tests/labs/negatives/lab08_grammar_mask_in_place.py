"""Masks the logits in place (masked_fill_) and returns them: the caller's tensor changes."""
EXERCISE = "8.6"


def apply_grammar_mask(logits, bitmask):
    vocab = logits.shape[-1]
    bits = torch.arange(32, dtype=torch.int32)
    allowed = ((bitmask.unsqueeze(-1) >> bits) & 1).reshape(bitmask.shape[0], -1)[:, :vocab].bool()
    return logits.masked_fill_(~allowed, float("-inf"))
