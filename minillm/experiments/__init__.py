"""Measurements that run whole models or engines and report what a technique costs or buys: what the
benchmarks (bench/), the labs and the visualizer print. They sit above everything they measure.

    quant_quality.py        perplexity, KL and top-1 agreement of a quantized model against full precision
    quant_sensitivity.py    which layers and projections are sensitive, and growing sets of quantized layers
    quant_cancellation.py   a search for sets whose errors cancel: more quantized, lower error
    quant_kernel_choice.py  every quantized matmul candidate timed at a model's own shapes on this CPU
    tp_communication.py     what tensor parallelism costs in all-reduces and buys in step time
    disagg_comparison.py    colocated against disaggregated serving: TTFT, ITL and bytes moved
    routing_trial.py        routing policies on a real fleet of servers: prefix hits, TTFT and throughput
"""
