"""Cuts the prompt into full chunks only, losing the tokens of the last partial one."""
EXERCISE = "4.2"


def prefill_chunks(prompt_len, budget, num_decodes):
    size = budget - num_decodes
    if size < 1:
        raise ValueError("no room")
    return [size] * (prompt_len // size)
