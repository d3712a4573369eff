"""Chunked prefill: what long prompts arriving mid-stream do to the requests already decoding.

Some requests are decoding when long prompts arrive, one every few steps. Unchunked, each long
prefill runs in one step and every running decode waits for it: an inter-token latency (ITL)
spike. Chunked (Sarathi-Serve), the prefill is cut into pieces that ride along with the decodes
under a per-step token budget. Reported: p50 / p99 ITL of the decoding requests, and throughput
(all output tokens / wall time), which chunking should leave about unchanged.
"""
import statistics
import time

import torch

from minillm import LLM, SamplingParams
from minillm.bench import SMALLER_QUICK, is_big, print_table, progress, write_json
from minillm.bench.conditions import check_conditions, machine_line
from minillm.perf.serving import percentile


def scenario(model: str, decoders: int, long_prompts: int, every: int, long_len: int, **config) -> dict:
    llm = LLM(model, max_num_seqs=decoders + long_prompts, **config)
    engine, vocab = llm.engine, llm.model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    short = SamplingParams(max_tokens=every * long_prompts + 16, temperature=0, ignore_eos=True)
    decode_ids = [engine.add_request(torch.randint(1, vocab, (16,), generator=gen).tolist(), short)
                  for _ in range(decoders)]
    arrivals = {every * (i + 1): torch.randint(1, vocab, (long_len,), generator=gen).tolist()
                for i in range(long_prompts)}
    done, steps, tokens = {}, 0, 0
    start = time.perf_counter()
    while engine.has_unfinished():
        if steps in arrivals:
            engine.add_request(arrivals[steps], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
        for chunk in engine.step():
            tokens += len(chunk.token_ids)
            if chunk.request is not None:
                done[chunk.request_id] = chunk.request
        steps += 1
    elapsed = time.perf_counter() - start
    itl = [gap for rid in decode_ids for gap in done[rid].metrics["itl"]]
    return {"itl_p50_ms": percentile(itl, 50) * 1e3, "itl_p99_ms": percentile(itl, 99) * 1e3,
            "itl_max_ms": max(itl) * 1e3, "tokens_per_s": tokens / elapsed, "steps": steps,
            "outputs": [done[rid].token_ids for rid in decode_ids]}


def run(quick: bool = False, json_path: str | None = None, model: str | None = None) -> dict:
    model = model or "tiny"
    conditions = check_conditions()
    big = quick and is_big(model)
    decoders, long_prompts, every, long_len, repeats = ((4, 2, 8, 256, 1) if big else (4, 3, 12, 320, 1) if quick
                                                        else (8, 6, 16, 448, 3))
    variants = {"unchunked": dict(enable_chunked_prefill=False, max_num_batched_tokens=512),
                "chunked (budget 64)": dict(enable_chunked_prefill=True, max_num_batched_tokens=64)}
    runs = {name: [] for name in variants}
    with progress("chunked", repeats * len(variants)) as bar:
        for rep in range(repeats):  # interleaved, so machine noise hits both alike
            for name, config in variants.items():
                bar.set_description(f"chunked: {name}, run {rep + 1}/{repeats}")
                runs[name].append(scenario(model, decoders, long_prompts, every, long_len, **config))
                bar.update()
    keys = ("itl_p50_ms", "itl_p99_ms", "itl_max_ms", "tokens_per_s")
    results = {name: {k: statistics.median(r[k] for r in rs) for k in keys} for name, rs in runs.items()}
    un, ch = results["unchunked"], results["chunked (budget 64)"]
    figures = {"model": model, "smaller_quick_workload": big, "decoding_requests": decoders,
               "long_prompts": long_prompts,
               "long_prompt_tokens": long_len, "repeats": repeats, **results,
               "p99_itl_ratio": un["itl_p99_ms"] / ch["itl_p99_ms"],
               "throughput_ratio": ch["tokens_per_s"] / un["tokens_per_s"],
               "outputs_identical": runs["unchunked"][0]["outputs"] == runs["chunked (budget 64)"][0]["outputs"]}
    print(f"{machine_line(conditions)}\nmodel: {model}; {decoders} requests decoding while {long_prompts} "
          f"prompts of {long_len} tokens arrive, one every {every} steps; median of {repeats}"
          + (f" (--quick: {SMALLER_QUICK})" if big else ""))
    print_table([{"variant": k, "ITL p50 ms": v["itl_p50_ms"], "ITL p99 ms": v["itl_p99_ms"],
                  "ITL max ms": v["itl_max_ms"], "output tok/s": v["tokens_per_s"]} for k, v in results.items()],
                "inter-token latency of the decoding requests")
    print(f"\nchunking cuts p99 ITL {figures['p99_itl_ratio']:.1f}x at {figures['throughput_ratio']:.2f}x the "
          f"throughput; outputs identical: {figures['outputs_identical']}")
    write_json(json_path, "chunked", figures, conditions)
    return figures
