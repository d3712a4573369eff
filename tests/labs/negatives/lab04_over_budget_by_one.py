"""Counts the budget as a last index rather than a count, so a step may compute budget + 1 tokens."""
EXERCISE = "4.3"


def continuous_step(sched, budget, max_num_seqs, chunked):
    batch, used = [], 0
    for seq in list(sched.running):
        if seq not in sched.running:
            continue
        n = min(seq.num_tokens_to_compute, budget - used + 1) if chunked else seq.num_tokens_to_compute
        if n == 0 or (used + n > budget + 1 and batch) or not sched.make_room(seq, n):
            continue
        batch.append((seq, n))
        used += n
    while sched.waiting and len(sched.running) < max_num_seqs and used <= budget:
        seq = sched.waiting[0]
        if not chunked and used + seq.num_tokens_to_compute > budget + 1 and batch:
            break
        if not sched.admit(seq):
            break
        n = min(seq.num_tokens_to_compute, budget - used + 1) if chunked else seq.num_tokens_to_compute
        batch.append((seq, n))
        used += n
    return batch
