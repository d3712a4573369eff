"""The shard is copied into a fresh torch.empty(...) of the default dtype: float32, whatever the weight is."""
EXERCISE = "9.1"


def _copy(view):
    shard = torch.empty(view.shape)
    shard.copy_(view)
    return shard


def shard_columns(weight, rank, world):
    out = weight.shape[0]
    if world < 1 or out % world:
        raise ValueError(f"world must be >= 1 and divide {out}, got {world}")
    if not 0 <= rank < world:
        raise ValueError(f"rank must be in 0..{world - 1}, got {rank}")
    part = out // world
    return _copy(weight[rank * part:(rank + 1) * part])


def shard_rows(weight, rank, world):
    return _copy(shard_columns(weight.T, rank, world).T)
