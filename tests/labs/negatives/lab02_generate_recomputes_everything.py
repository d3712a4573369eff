"""Runs the whole sequence through a fresh cache at every step: right tokens, no cache benefit."""
EXERCISE = "2.6"


def generate(model, prompt_ids, max_new_tokens, temperature=0.0, top_k=0, top_p=1.0, seed=0):
    generator, ids = torch.Generator().manual_seed(seed), list(prompt_ids)
    for _ in range(max_new_tokens):
        logits = forward_step(model, torch.tensor(ids), KVCache(model.config, len(ids)))[-1:]
        ids.append(int(sample(logits, temperature, top_k, top_p, generator)[0]))
    return ids[len(prompt_ids):]
