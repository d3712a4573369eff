"""One all-reduce per layer (forgets the attention's, after o_proj)."""
EXERCISE = "9.6"


def allreduce_bytes_per_token(hidden_size, num_layers, world, dtype_bytes=2):
    if world < 1:
        raise ValueError(f"world must be >= 1, got {world}")
    return num_layers * 2 * (world - 1) / world * hidden_size * dtype_bytes
