"""Beyond one process: tensor parallelism on torch.distributed (gloo, on CPU), `LLM(model,
tensor_parallel_size=N)`, and prefill/decode disaggregation, `DisaggregatedLLM(model)`.

    parallel_linear.py  cutting a linear layer by output (column) or input (row) features; the all-reduce
    tp_model.py         a loaded model -> rank r's shard (heads, MLP width, and so its KV pool, split N ways)
    workers.py          the process group: rank 0 is the engine, ranks 1..N-1 worker processes
    driver.py           rank 0's model: broadcasts each step to the workers, then runs its own shard
    comm.py             bytes and time all-reduced, measured and by formula
    measure.py          measure_tp_communication(): the figures the benchmarks print

    kv_transfer.py      a prompt's K/V packed into one buffer (only filled slots) and unpacked into other blocks
    handoff.py          the wire format between the workers: a header, tokens, generator states, the K/V (gloo)
    disagg_worker.py    the prefill and decode worker processes
    disagg.py           DisaggregatedLLM: both workers behind generate / stream, death and silence detected
    disagg_measure.py   measure_disaggregation(): colocated vs disaggregated TTFT and ITL, bytes moved
"""
