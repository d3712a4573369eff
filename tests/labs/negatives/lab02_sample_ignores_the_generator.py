"""Draws from torch's global random state instead of the request's generator."""
EXERCISE = "2.5"


def sample(logits, temperature, top_k, top_p, generator):
    if temperature == 0:
        return logits.argmax(-1)
    z = top_p_filter(top_k_filter(logits / temperature, top_k), top_p)
    return torch.multinomial(z.softmax(-1), 1).squeeze(-1)
