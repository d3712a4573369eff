"""Gives each admitted sequence its whole prompt to compute, as if no prefix-cache hit had supplied any of it."""
EXERCISE = "4.1"


def static_step(sched, max_num_seqs):
    if sched.running:
        batch = []
        for seq in list(sched.running):
            if seq in sched.running and sched.make_room(seq, seq.num_tokens_to_compute):
                batch.append((seq, seq.num_tokens_to_compute))
        return batch
    admitted = []
    while sched.waiting and len(sched.running) < max_num_seqs:
        seq = sched.waiting[0]
        n = seq.num_tokens_to_compute
        if not sched.admit(seq):
            break
        admitted.append((seq, n))
    return admitted
