"""Refuses only a negative chunk size, so a budget the decodes use up exactly divides by zero."""
EXERCISE = "4.2"


def prefill_chunks(prompt_len, budget, num_decodes):
    size = budget - num_decodes
    if size < 0:
        raise ValueError("no room")
    full, last = divmod(prompt_len, size)
    return [size] * full + ([last] if last else [])
