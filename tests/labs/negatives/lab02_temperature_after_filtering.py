"""Filters the raw logits and divides by the temperature afterwards, so top-p picks its nucleus at temperature 1."""
EXERCISE = "2.5"


def sample(logits, temperature, top_k, top_p, generator):
    if temperature == 0:
        return logits.argmax(-1)
    z = top_p_filter(top_k_filter(logits, top_k), top_p) / temperature
    return torch.multinomial(z.softmax(-1), 1, generator=generator).squeeze(-1)
