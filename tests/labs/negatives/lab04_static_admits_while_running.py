"""Fills free slots of a running static batch, which is continuous batching without a budget."""
EXERCISE = "4.1"


def static_step(sched, max_num_seqs):
    batch = []
    for seq in list(sched.running):
        if seq in sched.running and sched.make_room(seq, seq.num_tokens_to_compute):
            batch.append((seq, seq.num_tokens_to_compute))
    while sched.waiting and len(sched.running) < max_num_seqs and sched.admit(sched.waiting[0]):
        seq = sched.running[-1]
        batch.append((seq, seq.num_tokens_to_compute))
    return batch
