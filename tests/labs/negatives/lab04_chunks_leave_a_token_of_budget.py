"""Keeps one token of the budget in reserve, so every chunk is one token short."""
EXERCISE = "4.2"


def prefill_chunks(prompt_len, budget, num_decodes):
    size = budget - num_decodes - 1
    if size < 1:
        raise ValueError("no room")
    full, last = divmod(prompt_len, size)
    return [size] * full + ([last] if last else [])
