"""Greedy takes the argmax of the whole batch (a flat index) instead of each row's."""
EXERCISE = "2.5"


def sample(logits, temperature, top_k, top_p, generator):
    if temperature == 0:
        return logits.argmax()
    z = top_p_filter(top_k_filter(logits / temperature, top_k), top_p)
    return torch.multinomial(z.softmax(-1), 1, generator=generator).squeeze(-1)
