"""Divides the FLOPs by the attainable FLOP/s, min(peak, intensity x bandwidth): the same time
for real work, but 0 / 0 for a kernel that only moves bytes (a copy does no FLOPs)."""
EXERCISE = "0.2"


def roofline_time(flops, bytes_moved, peak_flops, bandwidth):
    return flops / min(peak_flops, flops / bytes_moved * bandwidth)
