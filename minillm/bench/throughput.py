"""Offline throughput: one seeded workload through each batching policy at several batch sizes,
and through transformers.

The default model has SmolLM2-135M's shape (random weights, as in the decode benchmark): its
540 MB of weights must stream from memory every step, as a real model's do, which is what makes
a full batch nearly free. (`--model tiny` runs the bundled 23 MB model instead: its weights sit
in the CPU's cache, a step's cost grows with its batch, and batching policies differ far less.)
Sequential (one request at a time, without --quick) runs the whole workload as well: its tokens/s depends on
the mix of prompt and output lengths it runs, so batching is compared with it on the same requests (the first
16 alone hold less prompt per output token than all 64, which made one at a time look faster).

Continuous and static batching run at every batch size of the sweep (4 to 32; 4 and 8 with
--quick), the two back to back in alternating order. Every workload holds at least twice as many
requests as the largest batch, with output lengths spread well below their cap, so a static batch
has members that finish early and continuous batching has slots to refill: with all requests in
one batch the two policies would run the same steps, and their ratio would only measure the
machine's drift between two runs. How much refilled slots can save is also modeled from the run's own measured
costs (`policy_model`, without --quick): with 64 requests, a batch of 32 makes two static groups, and the last
group's drain is one continuous batching pays too. The same model with every step costing a step of one sequence
(decode fully memory-bound, as on a GPU at these sizes) gives the most any engine could gain on this workload: with
prefill free as well, 1.64x, 1.84x, 1.68x and 1.28x at batch 4, 8, 16 and 32. Every variant generates exactly the
workload's output lengths (EOS ignored), so output tokens/s compare like with like. The phase-by-phase profile of
a batched decode step comes from a run of its own (its timers and observer are not in the timed runs).
transformers runs padded static batches of the largest size with `generate`; a padded batch runs
until its longest member is done, and only each request's own tokens are counted as output.
"""
import statistics
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from minillm import LLM, SamplingParams
from minillm.bench import SMALLER_QUICK, is_big, print_table, progress, write_json
from minillm.bench.catalog import SMOLLM_SHAPE
from minillm.bench.conditions import check_conditions, machine_line
from minillm.bench.synthetic_traffic import chat_workload
from minillm.models.registry import resolve_model_path
from minillm.testing import SMOLLM2_135M_SHAPE, make_hf_model

STEP_PHASES = {"schedule": "scheduler", "prepare": "step tensors (ids, positions, slot mapping, block tables)",
               "model": "model forward + logits", "attention": "  of which attention (block gathers + grouped SDPA)",
               "sample": "sampler", "update": "detokenizer + stop checks", "telemetry": "telemetry"}


@dataclass(frozen=True)
class Sweep:
    requests: int
    batch_sizes: tuple[int, ...]
    max_output: int      # output lengths are log-normal around median_output, capped here
    median_output: int
    max_prompt: int = 320  # prompt lengths, log-normal from 8 tokens around median_prompt, capped here
    median_prompt: int = 96


QUICK = Sweep(requests=16, batch_sizes=(4, 8), max_output=48, median_output=16)
# --quick on a big model: fewer requests, and prompts shorter than their outputs, so decode (what batching
# speeds up) is most of the time rather than prefill
QUICK_BIG = Sweep(requests=8, batch_sizes=(2, 4), max_output=32, median_output=16, max_prompt=64, median_prompt=16)
FULL = Sweep(requests=64, batch_sizes=(4, 8, 16, 32), max_output=192, median_output=64)


def make_prompts(workload, vocab: int, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(1, vocab, (r.prompt_len,), generator=gen).tolist() for r in workload]


def run_minillm(model: str, prompts, workload, observer=None, metrics: list | None = None,
                preemptions: list | None = None, **config) -> tuple[float, list[list[int]]]:
    """-> (output tokens/s, each request's tokens); metrics: a list that receives each request's metrics;
    preemptions: one that receives how many times the run preempted a sequence."""
    llm = LLM(model, **config)
    params = [SamplingParams(max_tokens=r.output_len, temperature=0, ignore_eos=True) for r in workload]
    llm.generate(prompts[:2], params[:2], use_tqdm=False)  # warm-up
    if observer is not None:
        llm.engine.subscribe(observer)
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    if metrics is not None:
        metrics.extend(o.metrics for o in outs)
    if preemptions is not None:
        preemptions.append(llm.engine.view.num_preemptions)
    return sum(len(o.token_ids) for o in outs) / elapsed, [o.token_ids for o in outs]


def batching_bound(sequential: list[dict], decode_speedup: float) -> tuple[float, float]:
    """Amdahl's law for batching: each request of a sequential run spends ttft - queue_time prefilling and
    e2e - ttft decoding. Batching makes decode tokens decode_speedup times cheaper (a step of B sequences against
    B steps of one) but not prefill, which is compute-bound already. -> (the prefill share of the sequential
    run's time, the most a batched run can gain over it)."""
    prefill = sum(m["ttft"] - m["queue_time"] for m in sequential)
    share = prefill / sum(m["e2e"] - m["queue_time"] for m in sequential)
    return share, 1 / (share + (1 - share) / decode_speedup)


def policy_model(workload, step_ms: dict[int, float], prefill_ms_per_token: float, batch: int) -> tuple[float, float]:
    """What each policy should take on this workload, by a model of the costs this run measured: a decode step of n
    sequences costs step_ms interpolated at n (linearly between the sizes measured), a prompt prefill_ms_per_token
    a token in the step it joins. Static runs the requests in groups of `batch`, each until its longest is done;
    continuous admits the next request in the step after one finishes. -> (static ms, continuous ms). The model
    leaves out what both share (a prompt's chunks, the step's Python); its point is the shape: how much a refilled
    slot can save when the queue holds only requests / batch groups."""
    sizes = sorted(step_ms)

    def step(n: int) -> float:
        return float(np.interp(n, sizes, [step_ms[s] for s in sizes])) if n else 0.0

    static = 0.0
    for i in range(0, len(workload), batch):
        group = workload[i:i + batch]
        static += prefill_ms_per_token * sum(r.prompt_len for r in group)  # the prefill makes each first token
        static += sum(step(sum(r.output_len > s for r in group)) for s in range(1, max(r.output_len for r in group)))
    continuous, queue, left = 0.0, list(workload), []  # left: the tokens each running request still decodes
    while queue or left:
        joining = [queue.pop(0) for _ in range(min(batch - len(left), len(queue)))]
        continuous += step(len(left)) + prefill_ms_per_token * sum(r.prompt_len for r in joining)
        left = [n - 1 for n in left if n > 1] + [r.output_len - 1 for r in joining if r.output_len > 1]
    return static, continuous


def drain_share(metrics: list[dict]) -> float:
    """The share of an offline run (every request there from the start) that came after its last request was
    admitted: the batch drains, running ever fewer sequences, as a finite workload must."""
    return 1 - max(m["queue_time"] for m in metrics) / max(m["e2e"] for m in metrics)


@torch.inference_mode()
def run_transformers(model_dir, prompts, workload, batch_size: int) -> float:
    import transformers
    transformers.utils.logging.disable_progress_bar()
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    start, useful = time.perf_counter(), 0
    for i in range(0, len(prompts), batch_size):
        group, reqs = prompts[i:i + batch_size], workload[i:i + batch_size]
        width = max(map(len, group))
        ids = torch.tensor([[0] * (width - len(p)) + p for p in group])  # left padding
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in group])
        hf.generate(input_ids=ids, attention_mask=mask, do_sample=False, eos_token_id=None, pad_token_id=0,
                    max_new_tokens=max(r.output_len for r in reqs), min_new_tokens=max(r.output_len for r in reqs))
        useful += sum(r.output_len for r in reqs)
    return useful / (time.perf_counter() - start)


def decode_sweep(model: str, batches: tuple[int, ...], context: int = 64, steps: int = 6) -> list[dict]:
    """One decode step of B sequences at `context` tokens each, for each B -> tokens/s against B, and the
    arithmetic the step did: weight bytes streamed once per step, 2 x parameters FLOPs per sequence."""
    llm = LLM(model, max_num_seqs=max(batches))
    engine, weights = llm.engine, sum(p.numel() for p in llm.model.parameters())
    weight_bytes = sum(p.numel() * p.element_size() for p in llm.model.parameters())
    rows = []
    for b in batches:
        for i in range(b):
            engine.add_request(list(range(10 + i, 10 + i + context)),
                               SamplingParams(max_tokens=steps + 2, temperature=0, ignore_eos=True))
        while engine.view.num_waiting or any(s.num_output_tokens == 0 for s in engine.view.sequences()):
            engine.step()  # the prefills
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            engine.step()
            times.append(time.perf_counter() - start)
        while engine.has_unfinished():
            engine.step()
        step = statistics.median(times)
        rows.append({"batch": b, "step ms": step * 1e3, "tok/s": b / step,
                     "GFLOP/s": 2 * weights * b / step / 1e9, "weight GB/s": weight_bytes / step / 1e9})
    for row in rows:
        row["vs batch 1"] = f"{row['tok/s'] / rows[0]['tok/s']:.2f}x"
    return rows


def run(quick: bool = False, json_path: str | None = None, model: str | None = None) -> dict:
    """model: a bundled name or a Hugging Face directory (transformers loads the same files);
    None: a random checkpoint of SmolLM2-135M's shape, built with transformers."""
    conditions = check_conditions()
    if model is None:
        with tempfile.TemporaryDirectory() as tmp:
            make_hf_model(Path(tmp), "llama", **SMOLLM2_135M_SHAPE)
            return measure(tmp, SMOLLM_SHAPE, quick, json_path, conditions)
    return measure(str(resolve_model_path(model)), model, quick, json_path, conditions)


def measure(model: str, label: str, quick: bool, json_path: str | None, conditions: dict) -> dict:
    """Continuous against static batching at every batch size of the sweep (the two interleaved,
    in alternating order, so drift hits both alike); transformers and sequential for reference."""
    big = quick and is_big(model)
    sweep = QUICK_BIG if big else QUICK if quick else FULL
    n, batches, max_output = sweep.requests, sweep.batch_sizes, sweep.max_output
    workload = chat_workload(n, seed=0, max_output=max_output, median_output=sweep.median_output,
                            max_prompt=sweep.max_prompt, median_prompt=sweep.median_prompt)
    model_config = LLM(model).model.config
    prompts = make_prompts(workload, min(4096, model_config.vocab_size))
    # A KV pool that holds the largest batch at the longest lengths (SmolLM2 at 32: 755 MB; the CPU's default is
    # 256 MiB, 5,825 of its tokens): a policy is measured on how it batches, not on a pool too small for the batch
    # (at 32 the default pool preempted 3 sequences of a continuous run, one evening)
    pool = max(256 << 20, batches[-1] * (sweep.max_prompt + max_output) * model_config.kv_bytes_per_token(4))
    rates, outputs, full_steps, seq_metrics, batch_16_metrics, preempted = {}, {}, [], [], [], {}
    profiled = max(b for b in batches if b <= 16)  # a batched decode step, phase by phase (the engine's timings)

    def keep_full_decode_steps(event):
        if len(event.scheduled) == profiled and all(w.phase == "decode" for w in event.scheduled):
            full_steps.append(event.timings)

    with progress("throughput", 2 * len(batches) + (3 if quick else 4), unit="variant") as bar:
        for i, batch in enumerate(batches):
            order = ("continuous", "static") if i % 2 == 0 else ("static", "continuous")
            for policy in order:
                bar.set_description(f"throughput: {policy} batching, batch {batch}")
                name = f"{policy}, batch {batch}"
                metrics = batch_16_metrics if (policy, batch) == ("continuous", 16) else None
                count = []
                rates[name], outputs[name] = run_minillm(model, prompts, workload, metrics=metrics, preemptions=count,
                                                         scheduler=policy, max_num_seqs=batch, kv_cache_memory=pool)
                preempted[name] = count[0]
                bar.update()
        bar.set_description(f"throughput: one batch of {profiled}, profiled step by step")
        same_length = [replace(r, output_len=max_output // 2) for r in workload[:profiled]]  # all decode together
        run_minillm(model, prompts[:profiled], same_length, observer=keep_full_decode_steps,
                    profile_attention=True, scheduler="continuous", max_num_seqs=profiled)
        bar.update()
        if not quick:
            bar.set_description("throughput: sequential (one request at a time)")
            rates["sequential"], outputs["sequential"] = run_minillm(model, prompts, workload, metrics=seq_metrics,
                                                                     scheduler="sequential")
            bar.update()
        bar.set_description("throughput: one decode step at each batch size")
        sweep_rows = decode_sweep(model, (1, 4, 16) if quick else (1, 2, 4, 8, 16, 32))
        bar.update()
        bar.set_description(f"throughput: transformers padded batches of {batches[-1]}")
        rates[f"transformers, batch {batches[-1]}"] = run_transformers(model, prompts, workload, batches[-1])
        bar.update()
    ratios = [{"batch": b, "continuous tok/s": rates[f"continuous, batch {b}"],
               "static tok/s": rates[f"static, batch {b}"],
               "continuous / static": rates[f"continuous, batch {b}"] / rates[f"static, batch {b}"],
               "preempted (continuous, static)": f"{preempted[f'continuous, batch {b}']}, "
                                                 f"{preempted[f'static, batch {b}']}"} for b in batches]
    best = rates[f"continuous, batch {batches[-1]}"]
    reference = {k: v for k, v in rates.items() if not k.startswith(("continuous", "static"))}
    figures = {"model": label, "smaller_quick_workload": big, "requests": n, "batch_sizes": list(batches),
               "output_tokens": sum(r.output_len for r in workload), "kv_cache_memory": pool, "tokens_per_s": rates,
               "sweep": ratios,
               "continuous_never_slower_than_static": all(r["continuous / static"] >= 1 for r in ratios),
               f"continuous_batch_{batches[-1]}_vs": {k: best / v for k, v in reference.items()},
               "decode_step_sweep": sweep_rows,
               "outputs_identical_across_policies": all(o == outputs[f"continuous, batch {batches[-1]}"]
                                                        for o in outputs.values())}
    print(f"{machine_line(conditions)}\nmodel: {label}; {n} requests (prompt 8-{sweep.max_prompt}, "
          f"output 4-{max_output} tokens, log-normal, median {sweep.median_prompt} and {sweep.median_output})"
          + (f"; --quick: {SMALLER_QUICK}" if big else ""))
    print_table(ratios, "offline throughput: continuous vs static batching at each batch size")
    if full_steps:
        step = {k: statistics.median(t[k] for t in full_steps) for k in full_steps[0]}
        total = sum(v for k, v in step.items() if k != "attention")
        figures["batched_decode_step_ms"] = {k: v * 1e3 for k, v in step.items()}
        print_table([{"phase": STEP_PHASES.get(k, k), "ms per step": v * 1e3, "share": f"{v / total:.1%}"}
                     for k, v in step.items()],
                    f"one decode step of {profiled} sequences (a batch of {profiled} requests in a run of its own; "
                    f"median of {len(full_steps)} steps)")
    print_table(sweep_rows, "one decode step of B sequences (64 tokens of context each): where decode turns "
                            "compute-bound, tokens/s stops growing with B")
    if not quick:
        seq = rates["sequential"]
        figures["continuous_batch_16_vs_sequential"] = rates["continuous, batch 16"] / seq
        at_16 = next(r["tok/s"] for r in sweep_rows if r["batch"] == 16) / sweep_rows[0]["tok/s"]
        share, bound = batching_bound(seq_metrics, at_16)
        figures["sequential_prefill_share"], figures["batch_16_bound_vs_sequential"] = share, bound
        figures["batch_16_drain_share"] = drain = drain_share(batch_16_metrics)
        prefill_ms = 1e3 * sum(m["ttft"] - m["queue_time"] for m in seq_metrics) / sum(r.prompt_len for r in workload)
        steps = {r["batch"]: r["step ms"] for r in sweep_rows}
        modeled = {b: policy_model(workload, steps, prefill_ms, b) for b in batches}
        figures["continuous_vs_static_modeled"] = {b: s / c for b, (s, c) in modeled.items()}
        flat = {b: policy_model(workload, {1: steps[1]}, prefill_ms, b) for b in batches}  # every step a step of 1
        figures["continuous_vs_static_flat_step"] = {b: s / c for b, (s, c) in flat.items()}
        print(f"\noffline: continuous batching at batch 16 makes {figures['continuous_batch_16_vs_sequential']:.2f}x "
              f"the tokens/s of one request at a time. The bound (Amdahl): one at a time, prefill is {share:.0%} of "
              f"a request's time, and batching makes only decode cheaper (a step of 16 makes {at_16:.1f}x the "
              f"tokens/s of a step of 1), so batch 16 can gain at most {bound:.2f}x on this workload. Not in the "
              f"bound: the run's last {drain:.0%} came after its last request was admitted, with ever fewer than "
              f"16 running (a finite workload's drain)")
        print_table([{"batch": b, "measured": f"{r['continuous / static']:.2f}x",
                      "modeled": f"{figures['continuous_vs_static_modeled'][b]:.2f}x",
                      "a flat step": f"{figures['continuous_vs_static_flat_step'][b]:.2f}x",
                      "static groups": -(-n // b)} for b, r in zip(batches, ratios)],
                    f"continuous / static: measured, and modeled from this run's own costs (a decode step by batch "
                    f"size, above; prefill {prefill_ms:.2f} ms a prompt token, from one request at a time) on this "
                    f"workload's lengths; 'a flat step': the same with every step costing a step of 1 (decode "
                    f"memory-bound at every batch size, as on a GPU), the most any engine could gain here. With few "
                    f"static groups, refilled slots have little to save: the last group's drain is one both policies "
                    f"pay. Where a step's cost grows with its rows (compute-bound), a static batch's emptied slots "
                    f"cost little, and refilling them saves little")
    print_table([{"variant": k, "output tok/s": v, f"continuous (batch {batches[-1]}) is": f"{best / v:.2f}x"}
                 for k, v in reference.items()], "for reference")
    print(f"\ncontinuous never slower than static: {figures['continuous_never_slower_than_static']}; "
          f"greedy outputs identical across minillm policies and batch sizes: "
          f"{figures['outputs_identical_across_policies']}")
    write_json(json_path, "throughput", figures, conditions)
    return figures
