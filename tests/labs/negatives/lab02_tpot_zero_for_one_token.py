"""Reports a TPOT of 0 for a single output token, where there is no time per output token to report."""
EXERCISE = "2.7"


def latency_metrics(arrival, token_times):
    ttft = token_times[0] - arrival
    if len(token_times) == 1:
        return ttft, 0.0
    return ttft, (token_times[-1] - token_times[0]) / (len(token_times) - 1)
