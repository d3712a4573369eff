"""Lets the members of a static batch decode without making KV room for their new tokens."""
EXERCISE = "4.1"


def static_step(sched, max_num_seqs):
    if not sched.running:
        while sched.waiting and len(sched.running) < max_num_seqs and sched.admit(sched.waiting[0]):
            pass
    return [(seq, seq.num_tokens_to_compute) for seq in sched.running]
