"""Prefill/decode disaggregation: `DisaggregatedLLM(model)` runs two whole engines in two processes, one
computing prompts and one decoding them, and moves each prompt's K/V between them. It composes engines,
so it sits above the facades.

    kv_transfer.py         a prompt's K/V packed into one buffer (only filled slots) and unpacked into other blocks
    handoff.py             the wire format between the workers: a header, tokens, generator states, the K/V (gloo)
    worker_processes.py    the prefill and decode worker processes
    disaggregated_llm.py   DisaggregatedLLM: both workers behind generate / stream, death and silence detected

Colocated against disaggregated serving is measured by experiments/disagg_comparison.py.
"""
