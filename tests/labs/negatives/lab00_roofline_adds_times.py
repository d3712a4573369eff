"""Adds compute and memory time, as if they could not overlap."""
EXERCISE = "0.2"


def roofline_time(flops, bytes_moved, peak_flops, bandwidth):
    return flops / peak_flops + bytes_moved / bandwidth
