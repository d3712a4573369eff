"""Each benchmark's headline: the one sentence of figures its record fills in, for the README's table and the top
of its section on the benchmarks page (docs/render_benchmarks.py). A record whose shape no longer fits its
headline is an error that names the record and the missing field, never a silently stale sentence.
"""


def _x(value: float) -> str:
    return f"{value:.2f}x"


def _pct(value: float) -> str:
    return f"{value:.1%}"


# benchmark -> the one sentence its record fills in; the README's table and each section's summary
HEADLINES = {
    "decode": lambda r: (f"single-stream decode at {_pct(r['minillm_vs_bare_loop'])} of the bare loop of its matrix "
                         f"products and {_x(r['minillm_vs_transformers'])} transformers; the KV cache "
                         f"{_x(r['per_context'][-1]['speedup'])} faster than recompute at "
                         f"{r['per_context'][-1]['context']} tokens of context"
                         + "".join(f"; {v['minillm_vs_it']:.2f}x {name}"  # a dict when llama.cpp ran, else why not
                                   for name, v in (r.get("llama_cpp") if isinstance(r.get("llama_cpp"), dict)
                                                   else {}).items())),
    "memory": lambda r: (f"KV memory wasted: {_pct(r['contiguous, max_model_len']['waste'])} contiguous at max "
                         f"length, {_pct(r['paged, block 16']['waste'])} paged (block 16); "
                         f"{r['paged, block 16']['concurrency'] / r['contiguous, max_model_len']['concurrency']:.1f}x "
                         f"the requests at once"),
    "prefix": lambda r: (f"median TTFT {_x(r['ttft_speedup'])} lower with prefix caching "
                         f"({r['ttft_ms_off']:.1f} → {r['ttft_ms_on']:.1f} ms), {_pct(r['hit_rate'])} hit rate"
                         + (f"; a multi-turn chat's last turn {_x(r['chat_ttft_speedup'])} lower"
                            if "chat_ttft_speedup" in r else "")),
    "chunked": lambda r: (f"p99 inter-token latency {_x(r['p99_itl_ratio'])} lower with chunked prefill, at "
                          f"{_x(r['throughput_ratio'])} the throughput"),
    "spec": lambda r: ("batch 1, greedy: " + "; ".join(
        f"{b['proposer']} {_x(b['speedup'])} on {workload} (k = {b['k']}, alpha {b['alpha']:.2f})"
        for workload, b in r["best_batch1"].items())),
    "throughput": lambda r: ("continuous batching " + ", ".join(
        f"{_x(row['continuous / static'])} static at batch {row['batch']}" for row in r["sweep"])
        + (" (modeled from the run's costs: " + ", ".join(map(_x, r["continuous_vs_static_modeled"].values()))
           + ("; with every decode step costing a step of 1, as memory-bound decode would: " + ", ".join(
               map(_x, r["continuous_vs_static_flat_step"].values())) if "continuous_vs_static_flat_step" in r else "")
           + ")" if "continuous_vs_static_modeled" in r else "")
        + (f"; offline, batch 16 {_x(r['continuous_batch_16_vs_sequential'])} one request at a time"
           if "continuous_batch_16_vs_sequential" in r else "")
        + "; " + ", ".join(f"{_x(ratio)} {name}" for name, ratio
                           in r[f"continuous_batch_{r['batch_sizes'][-1]}_vs"].items())),
    "serve": lambda r: (f"continuous batching {_x(r['ratios']['goodput_continuous_over_static'])} the goodput of "
                        f"static and {_x(r['ratios']['goodput_continuous_over_sequential'])} sequential on the same "
                        f"arrivals; offline batch {_x(r['cost']['batch_cheaper_x'])} cheaper per token than online"),
    # decode at one thread: "vs full 1T" in records from the per-thread benchmark, "vs full" in older ones
    "quant": lambda r: ("; ".join(f"{row['scheme']}: {row['of fp32']} the bytes of fp32, perplexity "
                                  f"{row['perplexity']}, decode {row.get('vs full 1T', row.get('vs full'))}"
                                  for row in r["schemes"] if row["scheme"] != "full"
                                  and row["perplexity"] not in ("=", "-"))
                        + f" (full: perplexity {r['schemes'][0]['perplexity']})"
                        + "".join(f"; {row['minillm']} {_x(row['minillm / llama.cpp'])} {row['llama.cpp']}"
                                  for row in r.get("llama_cpp", []) if str(row["threads"]) == "1")),
    "profile": lambda r: (f"a step of one token {r['profile']['fixed'] * 1e3:.1f} ms, "
                          + ", ".join(f"{n} tokens {t * 1e3:.1f} ms more" for n, t in r["profile"]["token_curve"]
                                      if n in (2, 128, 1024))
                          + f"; a step keeps {r['profile']['persistence']:.2f} of the last one's pace"),
    "cluster": lambda r: ("the simulator against real runs: throughput off by " + ", ".join(
        row["error"] for row in r["validation"] if row["figure"] == "output tok/s")
        + f", the worst latency percentile by {r['validation_worst_error']:.0%}; simulated fleet prefix hits "
        + ", ".join(f"{row['prefix hits']} {row['router']}" for row in r["routing"])),
    "agents": lambda r: (f"a {r['variants']['recompute']['pool_blocks']}-block pool holds "
                         f"{r['sessions_held_small_pool']:.1f} waiting sessions alone, "
                         f"{r['sessions_held_small_pool_plus_tier']:.1f} with the offload tier"),
    "kernels": lambda r: (f"{sum(row['ok'] for row in r['smoke'])} of {len(r['smoke'])} kernels match their "
                          f"PyTorch spec in Triton's CPU interpreter (correctness only: speed needs a GPU)"
                          if "smoke" in r else
                          f"on {r['device']}: end-to-end decode on the Triton backend "
                          f"{_x(r['end_to_end']['speedup'])} the torch backend's, same greedy tokens: "
                          f"{'yes' if r['end_to_end']['same_tokens'] else 'no'}"),
}


def headline(record: dict, source: str) -> str:
    """The record's headline sentence, or '' for a benchmark without one."""
    make = HEADLINES.get(record["benchmark"])
    if make is None:
        return ""
    try:
        return make(record)
    except (KeyError, IndexError, TypeError, AttributeError) as e:
        raise ValueError(f"{source}: the {record['benchmark']} record has no field {e} that its headline in "
                         f"docs/benchmark_headlines.py reads; update HEADLINES or the record") from None
