"""Rounds the target down (floor): a fleet one replica short whenever the queue is not a multiple."""
EXERCISE = "9.5"


def autoscale_rule(state, per_replica=16.0, keep=0.7):
    want = math.floor((state.waiting + state.running) / per_replica)
    have = state.replicas + state.starting
    if want >= have:
        return want
    if state.starting:
        return have
    if want <= keep * state.replicas:
        return max(1, math.floor(keep * state.replicas))
    return state.replicas
