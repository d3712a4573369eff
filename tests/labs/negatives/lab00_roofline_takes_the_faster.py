"""Takes the shorter of the two times (min, as in the attainable-FLOP/s formula) instead of the longer."""
EXERCISE = "0.2"


def roofline_time(flops, bytes_moved, peak_flops, bandwidth):
    return min(flops / peak_flops, bytes_moved / bandwidth)
