"""Admits while num_waiting <= max_waiting: one request more than the cap waits."""
EXERCISE = "8.5"


def admit(num_waiting, max_waiting, drain_rate):
    if num_waiting <= max_waiting:
        return None
    excess = num_waiting - max_waiting + 1
    return float(max(1, math.ceil(excess / (drain_rate if drain_rate > 0 else 1.0))))
