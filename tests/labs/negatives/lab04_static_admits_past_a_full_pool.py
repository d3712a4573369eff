"""When the pool has no room for the front of the queue, admits the smaller prompts behind it."""
EXERCISE = "4.1"


def static_step(sched, max_num_seqs):
    if sched.running:
        batch = []
        for seq in list(sched.running):
            if seq in sched.running and sched.make_room(seq, seq.num_tokens_to_compute):
                batch.append((seq, seq.num_tokens_to_compute))
        return batch
    for seq in list(sched.waiting):
        if len(sched.running) < max_num_seqs:
            sched.admit(seq)
    return [(seq, seq.num_tokens_to_compute) for seq in sched.running]
