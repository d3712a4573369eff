"""Zeroes the filtered-out probabilities out of place (the result is dropped), so it draws from the unfiltered ones."""
EXERCISE = "2.5"


def sample(logits, temperature, top_k, top_p, generator):
    if temperature == 0:
        return logits.argmax(-1)
    z = top_p_filter(top_k_filter(logits / temperature, top_k), top_p)
    probs = (logits / temperature).softmax(-1)
    probs.masked_fill(z.isinf(), 0.0)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
