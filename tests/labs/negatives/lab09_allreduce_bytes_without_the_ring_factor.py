"""Counts the payload once per all-reduce, without the ring's 2 (world - 1) / world."""
EXERCISE = "9.6"


def allreduce_bytes_per_token(hidden_size, num_layers, world, dtype_bytes=2):
    if world < 1:
        raise ValueError(f"world must be >= 1, got {world}")
    return num_layers * 2 * hidden_size * dtype_bytes if world > 1 else 0
