"""Tensor parallelism on torch.distributed (gloo, on CPU): `LLM(model, tensor_parallel_size=N)` runs each
layer's heads and MLP split N ways. A way to run the model, so it sits below the engine.

    parallel_linear.py  cutting a linear layer by output (column) or input (row) features; the all-reduce
    tp_model.py         a loaded model -> rank r's shard (heads, MLP width, and so its KV pool, split N ways)
    workers.py          the process group: rank 0 is the engine, ranks 1..N-1 worker processes
    driver.py           rank 0's model: broadcasts each step to the workers, then runs its own shard
    comm.py             bytes and time all-reduced, measured and by formula

What it costs and buys on this machine is measured by experiments/tp_communication.py.
"""
