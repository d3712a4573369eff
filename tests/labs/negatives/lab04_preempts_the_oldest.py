"""Preempts the oldest running sequence, throwing away the most work."""
EXERCISE = "4.4"


def make_room(sched, seq, num_tokens):
    while not sched.grow(seq, num_tokens):
        victim = sched.running[0]
        sched.preempt(victim)
        if victim is seq:
            return False
    return True
