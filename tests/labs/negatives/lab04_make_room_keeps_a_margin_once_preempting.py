"""After the first preemption it asks for a token of margin: where the victims' blocks exactly cover the need,
it preempts one victim more."""
EXERCISE = "4.4"


def make_room(sched, seq, num_tokens):
    margin = 0
    while not sched.grow(seq, num_tokens + margin):
        victim = sched.running[-1]
        sched.preempt(victim)
        if victim is seq:
            return False
        margin = 1
    return True
