"""Divides the probabilities by the temperature (which renormalising undoes) instead of the logits."""
EXERCISE = "2.5"


def sample(logits, temperature, top_k, top_p, generator):
    if temperature == 0:
        return logits.argmax(-1)
    probs = top_p_filter(top_k_filter(logits, top_k), top_p).softmax(-1) / temperature
    return torch.multinomial(probs / probs.sum(-1, keepdim=True), 1, generator=generator).squeeze(-1)
