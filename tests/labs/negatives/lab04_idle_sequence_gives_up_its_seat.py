"""Counts the seats under max_num_seqs by the sequences in this step's plan, not by every running one: a
running sequence that gets no tokens this step loses its seat to a waiting prompt."""
EXERCISE = "4.3"


def continuous_step(sched, budget, max_num_seqs, chunked):
    batch, left = [], budget
    for seq in list(sched.running):
        if seq not in sched.running:
            continue
        n = min(seq.num_tokens_to_compute, left) if chunked else seq.num_tokens_to_compute
        if n == 0 or (n > left and batch):
            continue
        if not sched.make_room(seq, n):
            continue
        batch.append((seq, n))
        left -= n
    while sched.waiting and len(batch) < max_num_seqs and left > 0:
        seq = sched.waiting[0]
        if not chunked and seq.num_tokens_to_compute > left and batch:
            break
        if not sched.admit(seq):
            break
        n = min(seq.num_tokens_to_compute, left) if chunked else seq.num_tokens_to_compute
        batch.append((seq, n))
        left -= n
    return batch
