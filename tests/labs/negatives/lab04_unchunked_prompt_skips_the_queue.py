"""Skips a waiting prompt that does not fit and admits the smaller ones behind it."""
EXERCISE = "4.3"


def continuous_step(running, waiting, budget, max_num_seqs, chunked=True):
    batch, left = [], budget
    for r in running:
        n = min(r.remaining, left) if chunked else r.remaining
        if n == 0 or (n > left and batch):
            continue
        batch.append((r, n))
        left -= n
    for r in list(waiting):
        if len(running) >= max_num_seqs or left <= 0:
            break
        n = min(r.remaining, left) if chunked else r.remaining
        if n > left and batch:
            continue
        waiting.remove(r)
        running.append(r)
        batch.append((r, n))
        left -= n
    return batch
