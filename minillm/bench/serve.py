"""Online serving under load: the OpenAI-compatible server driven by the load generator.

In process (no --base-url), measured in one run on the same seeded workload:
  1. offline batch: every request in one engine at once (the Batch API runner): the machine's
     full throughput, and the capacity C (requests/s) the request rates below are multiples of;
  2. schedulers: the same seeded Poisson arrivals at 0.75 C against servers batching
     continuously, statically and one request at a time: goodput and p99 TTFT, and their ratios;
  3. a sweep of request rates (the latency-throughput curve) on the continuous server;
  4. cost: $/1M output tokens online at the highest swept load meeting the SLO vs offline batch.
The SLO (TTFT <= 1 s, TPOT <= 100 ms) is an interactive product's, the same on every machine.
Against any other server (--base-url, e.g. vLLM or SGLang): the table at --rate or
--max-concurrency, and the sweep with --sweep.
"""
import asyncio
import gc
import json
import math
import tempfile
from dataclasses import asdict
from pathlib import Path

from minillm.bench import SMALLER_QUICK, is_big, print_table, write_json
from minillm.bench.conditions import check_conditions, machine_line
from minillm.perf.cost import DEFAULT_PRICE_PER_HOUR, best_online_load, online_vs_batch
from minillm.perf.serving import summarize
from minillm.serve.load_prompts import make_workload
from minillm.serve.loadgen import LoadResult, run_load

SCHEDULERS = ("continuous", "static", "sequential")
# An interactive product's SLO: the first token within a second, then faster than a person reads
# (10 tokens/s, about 7 words/s). Fixed, not relative to the machine, so a slower machine meets it
# at a lower load, which is what the cost comparison prices.
SLO = {"ttft": 1.0, "tpot": 0.1}
COMPARE_LOAD = 0.75                       # the schedulers' request rate, as a fraction of the capacity
SWEEP_LOADS = {True: (0.25, 0.5, 1.0, 2.0), False: (0.125, 0.25, 0.5, 1.0, 1.5, 2.0)}  # by --quick
QUICK_BIG_SWEEP = (0.5, 2.0)  # --quick on a big model: a light and an overloaded point of the curve


def sizes(quick: bool, big: bool = False) -> dict:
    """big: --quick on a big model, fewer and shorter requests."""
    if big:
        return dict(n=8, prompt_len=32, output_len=8)
    return dict(n=16, prompt_len=32, output_len=12) if quick else dict(n=48, prompt_len=128, output_len=64)


def load(base_url: str, items, model: str, **options) -> LoadResult:
    return asyncio.run(run_load(base_url, items, model=model, ignore_eos=True, **options))


def in_process_server(model: str, scheduler: str, weights=None):
    """A server on its own engine, with `scheduler`; weights: an engine's loaded model to share (read-only:
    a forward keeps no state in it), so side-by-side servers of a big model do not each hold a copy."""
    from minillm.async_llm import AsyncLLM
    from minillm.config import EngineConfig
    from minillm.engine.engine import LLMEngine
    from minillm.serve.server import serve_in_thread
    engine = LLMEngine(EngineConfig.from_knobs(model, scheduler=scheduler), weights)
    return serve_in_thread(AsyncLLM.from_engine(engine))


def offline_batch(model: str, items) -> dict:
    """The Batch API runner on the same prompts: -> its stats (output_throughput in tokens/s)."""
    from minillm.serve.batch import run_batch
    with tempfile.TemporaryDirectory() as tmp:
        inp, out = Path(tmp) / "in.jsonl", Path(tmp) / "out.jsonl"
        inp.write_text("".join(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions",
                                           "body": {"model": model, "prompt": w.prompt, "max_tokens": w.max_tokens,
                                                    "temperature": 0.0, "ignore_eos": True}}) + "\n"
                               for i, w in enumerate(items)))
        return run_batch(inp, out, model=model)


FIGURES = [("successful requests", "completed", 1), ("failed requests", "failed", 1), ("duration s", "duration_s", 1),
           ("request throughput req/s", "request_throughput", 1), ("output tokens/s", "output_throughput", 1),
           ("total tokens/s", "total_token_throughput", 1),
           *[(f"{m.upper()} {stat} ms", f"{m}_{stat}", 1e3) for m in ("ttft", "tpot", "itl", "e2e")
             for stat in ("mean", "median", "p90", "p99")],
           ("goodput req/s (all SLOs)", "goodput", 1), ("requests meeting the SLOs", "slo_attainment", 1)]


def standard_table(summaries: dict[str, dict], title: str) -> None:
    """vLLM's serving report, one column per run."""
    print_table([{"": label, **{name: s[key] * scale if key in s else "-" for name, s in summaries.items()}}
                 for label, key, scale in FIGURES], title)


def rate_sweep(base_url: str, model: str, rates: list[float], slo: dict, shape: dict, seed: int,
               tokenizer_model: str = "tiny") -> list[dict]:
    """One load test per rate, each with its own prompts (a repeat would hit the prefix cache);
    tokenizer_model: whose tokens the prompt lengths count."""
    points = []
    for i, rate in enumerate(rates):
        items = make_workload(shape["n"], seed=seed + 1 + i, prompt_len=shape["prompt_len"],
                              output_len=shape["output_len"], range_ratio=0.5, tokenizer_model=tokenizer_model)
        result = load(base_url, items, model, rate=rate, seed=seed + 1 + i, desc=f"serve: {rate} req/s")
        points.append({"rate": rate, **summarize(result.records, result.duration, slo),
                       "records": [asdict(r) for r in result.records]})
    print_table([{"rate req/s": p["rate"], "req/s": p["request_throughput"], "out tok/s": p["output_throughput"],
                  "TTFT p50 ms": p["ttft_median"] * 1e3, "TTFT p99 ms": p["ttft_p99"] * 1e3,
                  "TPOT p50 ms": p["tpot_median"] * 1e3, "TPOT p99 ms": p["tpot_p99"] * 1e3,
                  "goodput req/s": p["goodput"], "good tok/s": p["good_output_throughput"],
                  "met SLO": f"{p['slo_attainment']:.0%}"}
                 for p in points], "latency-throughput curve (Poisson arrivals at each rate)")
    return points


def remote(base_url: str, model: str, shape: dict, rate: float, max_concurrency: int | None,
           rates: list[float] | None, slo: dict, seed: int) -> dict:
    """Any OpenAI-compatible server: the table at one load, and the curve with --sweep."""
    items = make_workload(shape["n"], seed=seed, prompt_len=shape["prompt_len"], output_len=shape["output_len"],
                          range_ratio=0.5)
    result = load(base_url, items, model, rate=rate, max_concurrency=max_concurrency, seed=seed, desc="serve")
    summary = summarize(result.records, result.duration, slo)
    standard_table({base_url: summary}, f"{len(items)} requests at {rate} req/s, max concurrency {max_concurrency}")
    out = {"summary": summary, "records": [asdict(r) for r in result.records]}
    if rates:
        out["sweep"] = rate_sweep(base_url, model, rates, slo, shape, seed)
    return out


def compare_schedulers(model: str, items, rate: float, slo: dict, seed: int, weights=None) -> dict:
    """The same seeded arrivals against one fresh server per scheduler (its own engine and KV pool; the
    weights shared)."""
    out = {}
    for scheduler in SCHEDULERS:
        with in_process_server(model, scheduler, weights) as server:
            result = load(server.base_url, items, model, rate=rate, seed=seed, desc=f"serve: {scheduler}")
        gc.collect()  # the stopped server's engine and KV pool, now rather than when the collector next runs
        out[scheduler] = {**summarize(result.records, result.duration, slo),
                          "records": [asdict(r) for r in result.records]}
    return out


def run(quick: bool = False, json_path: str | None = None, model: str | None = None, base_url: str | None = None,
        rate: float | None = None, sweep: list[float] | None = None, max_concurrency: int | None = None,
        price_per_hour: float = DEFAULT_PRICE_PER_HOUR, seed: int = 0, slo: dict | None = None) -> dict:
    model, slo = model or "tiny", slo or SLO
    conditions = check_conditions()
    big = quick and base_url is None and is_big(model)
    shape = sizes(quick, big)
    print(f"{machine_line(conditions)}\nmodel: {model}; {shape['n']} requests of ~{shape['prompt_len']} prompt and "
          f"~{shape['output_len']} output tokens (held-out corpus, +-50%, ignore_eos)"
          + (f"; --quick: {SMALLER_QUICK}, {len(QUICK_BIG_SWEEP)} swept rates" if big else ""))
    if base_url is not None:
        figures = remote(base_url, model, shape, rate or math.inf, max_concurrency, sweep, slo, seed)
        write_json(json_path, "serve", figures, conditions)
        return figures
    items = make_workload(shape["n"], seed=seed, prompt_len=shape["prompt_len"], output_len=shape["output_len"],
                          range_ratio=0.5, tokenizer_model=model)  # lengths in the served model's own tokens
    with in_process_server(model, "continuous") as server:
        load(server.base_url, items[:2], model, progress=False)  # warm-up: the first steps of a process are slow
        batch = offline_batch(model, items)
        capacity = batch["output_throughput"] / (batch["output_tokens"] / len(items))  # requests/s, all at once
        rates = sweep or [round(f * capacity, 2) for f in (QUICK_BIG_SWEEP if big else SWEEP_LOADS[quick])]
        print(f"offline batch: {batch['output_throughput']:.1f} output tokens/s = capacity {capacity:.2f} req/s; "
              f"SLO: TTFT <= {slo['ttft'] * 1e3:.0f} ms, TPOT <= {slo['tpot'] * 1e3:.0f} ms")
        rate = rate or round(COMPARE_LOAD * capacity, 2)
        schedulers = compare_schedulers(model, items, rate, slo, seed, server.llm.engine.model)
        points = rate_sweep(server.base_url, model, rates, slo, shape, seed, tokenizer_model=model)
    standard_table(schedulers, f"the same Poisson arrivals at {rate} req/s ({rate / capacity:.2f} x capacity)")
    cont, ratios = schedulers["continuous"], {}
    for name in SCHEDULERS[1:]:
        other = schedulers[name]
        # None: neither had a request meeting the SLO (a slow machine or a big model), so no ratio
        goodput = (cont["goodput"] / other["goodput"] if other["goodput"] else math.inf if cont["goodput"] else None)
        ratios[f"goodput_continuous_over_{name}"] = goodput
        ratios[f"ttft_p99_{name}_over_continuous"] = other["ttft_p99"] / cont["ttft_p99"]
        shown = "0 on both (no request met the SLO)" if goodput is None else f"{goodput:.1f}x higher"
        print(f"continuous vs {name}: goodput {shown}, "
              f"p99 TTFT {ratios[f'ttft_p99_{name}_over_continuous']:.1f}x lower")
    best = best_online_load(points)
    cost = online_vs_batch(price_per_hour, best and best["good_output_throughput"], batch["output_throughput"])
    print(f"\ncost at ${price_per_hour}/hour (--price-per-hour): batch {cost['batch_usd_per_1m']:.2f} $/1M output "
          f"tokens ({cost['batch_tokens_per_s']:.1f} tok/s)")
    if best is None:
        print("online: no request met the SLO at any swept rate")
    else:
        print(f"online at {best['rate']} req/s (the swept rate with the most output tokens/s from requests meeting "
              f"the SLO): {cost['online_usd_per_1m']:.2f} $/1M ({cost['online_tokens_per_s']:.1f} good tok/s); "
              f"batch is {cost['batch_cheaper_x']:.1f}x cheaper")
    figures = {"model": model, "smaller_quick_workload": big, "workload": shape, "slo": slo, "capacity_rps": capacity,
               "rate": rate, "batch": batch, "schedulers": schedulers, "ratios": ratios, "sweep": points, "cost": cost}
    write_json(json_path, "serve", figures, conditions)
    return figures
