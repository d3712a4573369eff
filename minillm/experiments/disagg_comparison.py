"""measure_disaggregation(): colocated vs disaggregated serving under a mixed workload, side by side.

The workload: a few requests decode long outputs while long prompts arrive one after another.
Colocated (one LLM), each long prompt's prefill shares a step with the running decodes, so their
next tokens wait for it: the inter-token latency (ITL) of the decoders spikes at every arrival.
Disaggregated, the prefill worker computes the prompt while the decode worker keeps decoding; the
prompt's KV cache then moves to the decode worker (bytes = P * layers * 2 * kv_heads * head_dim *
dtype bytes), which costs the long request some TTFT.

Times are taken where the caller sees them: TTFT = first chunk received - request sent, ITL = gaps
between a request's chunks. On a machine whose cores the two workers share (a 2-core CPU) they
compete for the same cores, so a prefill still slows the decodes: the figures say so honestly.
"""
import time

import torch

from minillm.disagg.disaggregated_llm import DisaggregatedLLM
from minillm.llm import LLM
from minillm.perf.machine import machine
from minillm.perf.serving import percentile
from minillm.sampling import SamplingParams


def mixed_workload(quick: bool, decode_tokens: int | None = None) -> list[tuple[float, str, list[int], SamplingParams]]:
    """(arrival second, kind, prompt ids, params): decoders at once, long prompts every 0.3 s while they
    decode (they make enough tokens to outlast the arrivals even at ~5 ms a token; decode_tokens: fewer, for a
    model whose steps take longer)."""
    decoders, longs, prompt_len = (3, 3, 320) if quick else (6, 6, 448)
    decode = SamplingParams(max_tokens=decode_tokens or (240 if quick else 480), temperature=0, ignore_eos=True)
    long = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    work = [(0.0, "decode", [50 + 13 * i + k for k in range(12)], decode) for i in range(decoders)]
    work += [(0.3 * (i + 1), "long", [(97 * i + 31 * k) % 3900 + 100 for k in range(prompt_len)], long)
             for i in range(longs)]
    return work


def replay(submit, next_chunks, work) -> dict[str, dict]:
    """Send each request at its arrival time and record when each of its chunks arrives.
    submit(prompt, params) -> request id; next_chunks() -> chunks (waiting briefly when idle)."""
    records, pending, unfinished = {}, sorted(work, key=lambda w: w[0]), 0
    start = time.perf_counter()
    while pending or unfinished:
        while pending and pending[0][0] <= time.perf_counter() - start:
            _, kind, prompt, params = pending.pop(0)
            rid = submit(prompt, params)
            records[rid] = {"kind": kind, "sent": time.perf_counter(), "times": []}
            unfinished += 1
        if not unfinished:
            time.sleep(max(0.0, pending[0][0] - (time.perf_counter() - start)))
            continue
        for chunk in next_chunks():
            now = time.perf_counter()
            records[chunk.request_id]["times"] += [now] * len(chunk.token_ids)
            unfinished -= chunk.request is not None
    return records


def latency_figures(records: dict[str, dict]) -> dict[str, float]:
    """TTFT of the long prompts and ITL of the decoders (p50, p99, max), in milliseconds."""
    ttft = [(r["times"][0] - r["sent"]) * 1e3 for r in records.values() if r["kind"] == "long"]
    itl = [(b - a) * 1e3 for r in records.values() if r["kind"] == "decode" for a, b in zip(r["times"], r["times"][1:])]
    return {"ttft_long_p50_ms": percentile(ttft, 50), "ttft_long_p99_ms": percentile(ttft, 99),
            "itl_decode_p50_ms": percentile(itl, 50), "itl_decode_p99_ms": percentile(itl, 99),
            "itl_decode_max_ms": max(itl)}


def measure_disaggregation(model: str = "tiny", quick: bool = True, decode_tokens: int | None = None,
                           **config) -> dict:
    """The mixed workload (mixed_workload(quick, decode_tokens)) run colocated (one LLM) and disaggregated (two
    workers), one after the other on this machine. -> {"colocated": figures, "disaggregated": figures,
    "kv_bytes_per_request": {prompt tokens: bytes}, "machine", "threads"}."""
    work, warm = mixed_workload(quick, decode_tokens), SamplingParams(max_tokens=2, temperature=0)
    with DisaggregatedLLM(model, **config) as disagg:
        disagg.generate([work[-1][2]], warm)
        split = replay(disagg.add_request, lambda: disagg.poll(timeout=0.005), work)
        moved = {len(prompt): disagg.transfers[rid]["kv_bytes"]
                 for rid, (_, _, prompt, _) in zip(split, sorted(work, key=lambda w: w[0]))}
        threads = disagg.threads
    # colocated with as many torch threads as one worker: on a busy machine, more threads than free
    # cores spin-wait in OpenMP barriers and would measure the contention, not the schedule
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        llm = LLM(model, **config)
        llm.generate([work[-1][2]], warm, use_tqdm=False)
        colocated = replay(llm.engine.add_request, llm.engine.step, work)
    finally:
        torch.set_num_threads(saved)
    return {"colocated": latency_figures(colocated), "disaggregated": latency_figures(split),
            "kv_bytes_per_request": moved, "machine": machine(),
            "threads": f"{threads} torch thread(s) per worker and for the colocated LLM, all on this machine"}
