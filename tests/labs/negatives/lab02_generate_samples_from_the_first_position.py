"""Samples the first new token from the prefill's first position instead of its last."""
EXERCISE = "2.6"


def generate(model, prompt_ids, max_new_tokens, temperature=0.0, top_k=0, top_p=1.0, seed=0):
    cache = KVCache(model.config, len(prompt_ids) + max_new_tokens)
    generator = torch.Generator().manual_seed(seed)
    logits = forward_step(model, torch.tensor(prompt_ids), cache)[:1]
    out = []
    for _ in range(max_new_tokens):
        token = int(sample(logits, temperature, top_k, top_p, generator)[0])
        out.append(token)
        if len(out) < max_new_tokens:
            logits = forward_step(model, torch.tensor([token]), cache)
    return out
