"""Treats decode as always memory-bound: step time = bytes / bandwidth, even at a huge batch."""
EXERCISE = "0.6"


def decode_tokens_per_s(cfg, context_len, batch_size, peak_flops, bandwidth, bytes_per_element):
    _, nbytes = decode_step_cost(cfg, context_len, batch_size, bytes_per_element)
    return batch_size / (nbytes / bandwidth)
