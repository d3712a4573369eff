"""Once it has preempted, asks for room for one token more than needed when the victim freed enough: the needy
sequence ends up holding a block too many, which the next request then lacks."""
EXERCISE = "4.4"


def make_room(sched, seq, num_tokens):
    if sched.grow(seq, num_tokens):
        return True
    while True:
        victim = sched.running[-1]
        sched.preempt(victim)
        if victim is seq:
            return False
        if sched.grow(seq, num_tokens + 1) or sched.grow(seq, num_tokens):
            return True
