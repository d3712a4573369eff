"""Refuses world 0 only: a negative world returns a positive number of bytes."""
EXERCISE = "9.6"


def allreduce_bytes_per_token(hidden_size, num_layers, world, dtype_bytes=2):
    if world == 0:
        raise ValueError("world must not be 0")
    return num_layers * 2 * 2 * (world - 1) / world * hidden_size * dtype_bytes
