"""Assumes one request per second only for a drain rate of exactly 0: a negative rate gives a negative wait,
clamped to 1 s."""
EXERCISE = "8.5"


def admit(num_waiting, max_waiting, drain_rate):
    if num_waiting < max_waiting:
        return None
    rate = drain_rate if drain_rate != 0 else 1.0
    return float(max(1, math.ceil((num_waiting - max_waiting + 1) / rate)))
