"""Draws from exp(z) without subtracting the row maximum: it overflows to inf at low temperatures."""
EXERCISE = "2.5"


def sample(logits, temperature, top_k, top_p, generator):
    if temperature == 0:
        return logits.argmax(-1)
    z = top_p_filter(top_k_filter(logits / temperature, top_k), top_p)
    return torch.multinomial(z.exp(), 1, generator=generator).squeeze(-1)
