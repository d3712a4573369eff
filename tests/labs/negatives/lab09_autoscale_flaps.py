"""Follows the queue both ways at once (the queue rule): scales down the moment the queue shrinks."""
EXERCISE = "9.5"


def autoscale_rule(state, per_replica=16.0, keep=0.7):
    return math.ceil((state.waiting + state.running) / per_replica)
