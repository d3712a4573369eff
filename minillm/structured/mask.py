"""The grammar mask step: keep only the logits of tokens the grammar allows next.

The matcher writes the allowed set as a bitmask: int32 words, one bit per vocabulary token, token
t at bit (t % 32) of word (t // 32). A [rows, vocab] logits tensor gets a [rows, ceil(vocab / 32)]
mask; a forbidden token's logit becomes -inf, so no sampler (greedy, top-k, top-p) can pick it.
"""
import torch


def apply_grammar_mask(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """logits: [rows, vocab] float; bitmask: [rows, words] int32, words >= ceil(vocab / 32).
    -> [rows, vocab]: the allowed logits unchanged, -inf elsewhere (a new tensor)."""
    vocab = logits.shape[-1]
    bits = torch.arange(32, device=bitmask.device, dtype=torch.int32)
    allowed = (bitmask.unsqueeze(-1) >> bits) & 1  # [rows, words, 32]: the sign bit shifts down as 1 too
    allowed = allowed.reshape(bitmask.shape[0], -1)[:, :vocab].bool()  # [rows, vocab]
    return logits.masked_fill(~allowed.to(logits.device), float("-inf"))
