"""Admits a prompt only while it is strictly smaller than the budget left."""
EXERCISE = "4.3"


def continuous_step(running, waiting, budget, max_num_seqs, chunked=True):
    batch, left = [], budget
    for r in running:
        n = min(r.remaining, left) if chunked else r.remaining
        if n == 0 or (n > left and batch):
            continue
        batch.append((r, n))
        left -= n
    while waiting and len(running) < max_num_seqs and left > 0:
        r = waiting[0]
        n = min(r.remaining, left) if chunked else r.remaining
        if n >= left and batch:
            break
        running.append(waiting.popleft())
        batch.append((r, n))
        left -= n
    return batch
