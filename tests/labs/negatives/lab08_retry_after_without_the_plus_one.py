"""Counts the requests past the cap without this one: num_waiting - max_waiting."""
EXERCISE = "8.5"


def admit(num_waiting, max_waiting, drain_rate):
    if num_waiting < max_waiting:
        return None
    return float(max(1, math.ceil((num_waiting - max_waiting) / (drain_rate if drain_rate > 0 else 1.0))))
