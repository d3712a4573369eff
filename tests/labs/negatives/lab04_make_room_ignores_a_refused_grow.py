"""Asks for room but ignores the answer, so the engine runs sequences whose K/V have no slots."""
EXERCISE = "4.E"


def make_room(sched, seq, num_tokens):
    sched.grow(seq, num_tokens)
    return True
