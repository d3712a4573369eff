"""Schedules the running sequences without making KV room for their new tokens."""
EXERCISE = "4.3"


def continuous_step(sched, budget, max_num_seqs, chunked):
    batch, left = [], budget
    for seq in sched.running:
        n = min(seq.num_tokens_to_compute, left) if chunked else seq.num_tokens_to_compute
        if n == 0 or (n > left and batch):
            continue
        batch.append((seq, n))
        left -= n
    while sched.waiting and len(sched.running) < max_num_seqs and left > 0:
        seq = sched.waiting[0]
        if not chunked and seq.num_tokens_to_compute > left and batch:
            break
        if not sched.admit(seq):
            break
        n = min(seq.num_tokens_to_compute, left) if chunked else seq.num_tokens_to_compute
        batch.append((seq, n))
        left -= n
    return batch
