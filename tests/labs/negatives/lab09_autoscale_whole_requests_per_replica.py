"""per_replica is taken as a whole number (int(per_replica)): right for 16 and 32, wrong for 12.5."""
EXERCISE = "9.5"


def autoscale_rule(state, per_replica=16.0, keep=0.7):
    per = int(per_replica)
    want = -(-(state.waiting + state.running) // per)
    have = state.replicas + state.starting
    if want >= have:
        return want
    if state.starting:
        return have
    if want <= keep * state.replicas:
        return max(1, math.floor(keep * state.replicas))
    return state.replicas
