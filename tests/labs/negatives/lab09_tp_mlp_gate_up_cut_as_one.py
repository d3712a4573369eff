"""Cuts the fused gate_up weight as one matrix: rank 0 gets gate rows only, rank 1 up rows only."""
EXERCISE = "9.2"


def tp_mlp_forward(x, gate_up, down, world, all_reduce):
    partials = []
    for rank in range(world):
        g, u = (x @ shard_columns(gate_up, rank, world).T).chunk(2, dim=-1)
        partials.append((F.silu(g) * u) @ shard_rows(down, rank, world).T)
    return all_reduce(partials)[0]
