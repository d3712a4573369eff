"""Builds the allowed-token mask on the bitmask's device (the CPU) and never moves it to the logits' device:
right on a CPU, an error on any accelerator."""
EXERCISE = "8.6"


def apply_grammar_mask(logits, bitmask):
    vocab = logits.shape[-1]
    bits = torch.arange(32, dtype=torch.int32)
    allowed = ((bitmask.unsqueeze(-1) >> bits) & 1).reshape(bitmask.shape[0], -1)[:, :vocab].bool()
    return logits.masked_fill(~allowed, float("-inf"))
