"""Predicts with bf16 weights (2 bytes per element) whatever bytes_per_element says."""
EXERCISE = "0.6"


def decode_tokens_per_s(cfg, context_len, batch_size, peak_flops, bandwidth, bytes_per_element):
    flops, nbytes = decode_step_cost(cfg, context_len, batch_size, 2)
    return batch_size / roofline_time(flops, nbytes, peak_flops, bandwidth)
