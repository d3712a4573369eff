"""With no recent drain (rate 0) answers Retry-After 0: an invitation to retry at once, a retry storm."""
EXERCISE = "8.5"


def admit(num_waiting, max_waiting, drain_rate):
    if num_waiting < max_waiting:
        return None
    if drain_rate <= 0:
        return 0.0
    return float(max(1, math.ceil((num_waiting - max_waiting + 1) / drain_rate)))
