"""Sends preempted sequences to the back of the queue, behind requests that arrived after them."""
EXERCISE = "4.4"


def make_room(sched, seq, num_tokens):
    while not sched.grow(seq, num_tokens):
        victim = sched.running[-1]
        sched.preempt(victim)
        sched.waiting.remove(victim)
        sched.waiting.append(victim)
        if victim is seq:
            return False
    return True
