"""Deals the input features out round robin (rank r keeps features r, r + world, ...), not in blocks."""
EXERCISE = "9.1"


def shard_rows(weight, rank, world):
    if world < 1 or weight.shape[1] % world or not 0 <= rank < world:
        raise ValueError(f"cannot cut {weight.shape[1]} features for rank {rank} of {world}")
    return weight[:, rank::world].contiguous()
