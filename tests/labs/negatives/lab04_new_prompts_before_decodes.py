"""Admits waiting prompts before the running decodes, so a long prompt can starve them."""
EXERCISE = "4.3"


def continuous_step(running, waiting, budget, max_num_seqs, chunked=True):
    batch, left, admitted = [], budget, []
    while waiting and len(running) + len(admitted) < max_num_seqs and left > 0:
        r = waiting[0]
        n = min(r.remaining, left) if chunked else r.remaining
        if n > left and batch:
            break
        admitted.append(waiting.popleft())
        batch.append((r, n))
        left -= n
    for r in running:
        n = min(r.remaining, left) if chunked else r.remaining
        if n == 0 or (n > left and batch):
            continue
        batch.append((r, n))
        left -= n
    running.extend(admitted)
    return batch
