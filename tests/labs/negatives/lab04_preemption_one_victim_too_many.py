"""Preempts before asking for room, so one sequence more than needed is always preempted."""
EXERCISE = "4.4"


def make_room(sched, seq, num_tokens):
    while True:
        victim = sched.running[-1]
        sched.preempt(victim)
        if victim is seq:
            return False
        if sched.grow(seq, num_tokens):
            return True
