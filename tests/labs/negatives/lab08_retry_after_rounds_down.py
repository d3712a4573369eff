"""Rounds the wait down (int()), so a fast-draining queue answers Retry-After 0."""
EXERCISE = "8.5"


def admit(num_waiting, max_waiting, drain_rate):
    if num_waiting < max_waiting:
        return None
    return float(int((num_waiting - max_waiting + 1) / (drain_rate if drain_rate > 0 else 1.0)))
