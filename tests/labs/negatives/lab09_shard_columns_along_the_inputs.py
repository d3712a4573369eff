"""Cuts the column-parallel shard along the input features (dim 1), the row-parallel cut."""
EXERCISE = "9.1"


def shard_columns(weight, rank, world):
    size = weight.shape[1]
    if world < 1 or size % world or not 0 <= rank < world:
        raise ValueError(f"cannot cut {size} features for rank {rank} of {world}")
    part = size // world
    return weight[:, rank * part:(rank + 1) * part].contiguous()
