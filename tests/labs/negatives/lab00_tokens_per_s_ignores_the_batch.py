"""Reports one token per step (1 / step time), not one per sequence of the batch."""
EXERCISE = "0.6"


def decode_tokens_per_s(cfg, context_len, batch_size, peak_flops, bandwidth, bytes_per_element):
    flops, nbytes = decode_step_cost(cfg, context_len, batch_size, bytes_per_element)
    return 1 / roofline_time(flops, nbytes, peak_flops, bandwidth)
