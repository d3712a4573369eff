"""Fills free slots of a running static batch, which is continuous batching without a budget."""
EXERCISE = "4.1"


def static_step(running, waiting, max_num_seqs):
    while waiting and len(running) < max_num_seqs:
        running.append(waiting.popleft())
    return [(r, r.remaining) for r in running]
