"""Refuses world 0 only, and bounds the rank by abs(world): a negative world that divides the size
(4 % -2 == 0) slips through, and rank 0 of world -2 gets rows 0 .. -2."""
EXERCISE = "9.1"


def shard_columns(weight, rank, world):
    out = weight.shape[0]
    if world == 0 or out % world:
        raise ValueError(f"world must divide {out}, got {world}")
    if not 0 <= rank < abs(world):
        raise ValueError(f"rank must be below {world}, got {rank}")
    part = out // world
    return weight[rank * part:(rank + 1) * part].clone(memory_format=torch.contiguous_format)


def shard_rows(weight, rank, world):
    return shard_columns(weight.T, rank, world).T.contiguous()
