"""Computes the unsharded MLP and never all-reduces: the right output, no tensor parallelism."""
EXERCISE = "9.2"


def tp_mlp_forward(x, gate_up, down, world, all_reduce):
    g, u = (x @ gate_up.T).chunk(2, dim=-1)
    return (F.silu(g) * u) @ down.T
