"""Walks over the running sequences as they were when the step began, and asks make_room for room for
one that an older sequence's make_room has already preempted this step."""
EXERCISE = "4.3"


def continuous_step(sched, budget, max_num_seqs, chunked):
    batch, left = [], budget
    for seq in list(sched.running):
        n = min(seq.num_tokens_to_compute, left) if chunked else seq.num_tokens_to_compute
        if n == 0 or (n > left and batch):
            continue
        if not sched.make_room(seq, n):
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
