"""Skips a waiting prompt that does not fit and admits the smaller ones behind it."""
EXERCISE = "4.3"


def continuous_step(sched, budget, max_num_seqs, chunked):
    batch, left = [], budget
    for seq in list(sched.running):
        if seq not in sched.running:
            continue
        n = min(seq.num_tokens_to_compute, left) if chunked else seq.num_tokens_to_compute
        if n == 0 or (n > left and batch) or not sched.make_room(seq, n):
            continue
        batch.append((seq, n))
        left -= n
    for seq in list(sched.waiting):
        if len(sched.running) >= max_num_seqs or left <= 0:
            break
        if not chunked and seq.num_tokens_to_compute > left and batch:
            continue
        if not sched.admit(seq):
            break
        n = min(seq.num_tokens_to_compute, left) if chunked else seq.num_tokens_to_compute
        batch.append((seq, n))
        left -= n
    return batch
