"""Keeps preempting after the needy sequence itself was preempted, as if it could still be given room."""
EXERCISE = "4.4"


def make_room(sched, seq, num_tokens):
    while sched.running and not sched.grow(seq, num_tokens):
        sched.preempt(sched.running[-1])
    return seq in sched.running
