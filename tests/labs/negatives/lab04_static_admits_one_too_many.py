"""Fills an idle static batch while at most max_num_seqs sequences run, admitting one too many."""
EXERCISE = "4.1"


def static_step(sched, max_num_seqs):
    if sched.running:
        batch = []
        for seq in list(sched.running):
            if seq in sched.running and sched.make_room(seq, seq.num_tokens_to_compute):
                batch.append((seq, seq.num_tokens_to_compute))
        return batch
    while sched.waiting and len(sched.running) <= max_num_seqs and sched.admit(sched.waiting[0]):
        pass
    return [(seq, seq.num_tokens_to_compute) for seq in sched.running]
