"""Forgets the replicas already starting: compares the target with the serving ones only, and shrinks
while the fleet is still growing."""
EXERCISE = "9.5"


def autoscale_rule(state, per_replica=16.0, keep=0.7):
    want = math.ceil((state.waiting + state.running) / per_replica)
    if want >= state.replicas:
        return want
    if want <= keep * state.replicas:
        return max(1, math.floor(keep * state.replicas))
    return state.replicas
