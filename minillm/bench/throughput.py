"""Offline throughput: one seeded workload through each batching policy, and through transformers.

The default model has SmolLM2-135M's shape (random weights, as in the decode benchmark): its
540 MB of weights must stream from memory every step, as a real model's do, which is what makes
a full batch nearly free. (`--model tiny` runs the bundled 23 MB model instead: its weights sit
in the CPU's cache, a step's cost grows with its batch, and batching policies differ far less.)
Sequential, much slower, is timed on the first 16 requests only (tokens/s hardly depends on
how many it runs).

Every variant generates exactly the workload's output lengths (EOS ignored), so output tokens/s
compare like with like. transformers runs padded static batches of the same size with
`generate`; a padded batch runs until its longest member is done, and only each request's own
tokens are counted as output.
"""
import tempfile
import time
from pathlib import Path

import torch

from minillm import LLM, SamplingParams
from minillm.bench import print_table, progress, write_json
from minillm.bench.conditions import check_conditions, machine_line
from minillm.bench.registry import SMOLLM_SHAPE
from minillm.bench.workload import chat_workload
from minillm.models.registry import resolve_model_path
from minillm.testing import SMOLLM2_135M_SHAPE, make_hf_model


def make_prompts(workload, vocab: int, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(1, vocab, (r.prompt_len,), generator=gen).tolist() for r in workload]


def run_minillm(model: str, prompts, workload, **config) -> tuple[float, list[list[int]]]:
    llm = LLM(model, **config)
    params = [SamplingParams(max_tokens=r.output_len, temperature=0, ignore_eos=True) for r in workload]
    llm.generate(prompts[:2], params[:2], use_tqdm=False)  # warm-up
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    return sum(len(o.token_ids) for o in outs) / elapsed, [o.token_ids for o in outs]


@torch.inference_mode()
def run_transformers(model_dir, prompts, workload, batch_size: int) -> float:
    import transformers
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
    n, batch = (32, 16) if quick else (128, 32)
    workload = chat_workload(n, seed=0, max_prompt=320, max_output=192, median_prompt=96, median_output=64)
    prompts = make_prompts(workload, 4096)
    rates, outputs = {}, {}
    policies = [("continuous", dict(scheduler="continuous", max_num_seqs=batch)),
                ("static", dict(scheduler="static", max_num_seqs=batch))]
    with progress("throughput", len(policies) + (1 if quick else 2), unit="variant") as bar:
        for name, config in policies:
            bar.set_description(f"throughput: {name} batching")
            rates[name], outputs[name] = run_minillm(model, prompts, workload, **config)
            bar.update()
        if not quick:
            bar.set_description("throughput: sequential (first 16)")
            rates["sequential (first 16)"], seq_out = run_minillm(model, prompts[:16], workload[:16],
                                                                  scheduler="sequential")
            outputs["sequential"] = seq_out + outputs["continuous"][16:]
            bar.update()
        bar.set_description("throughput: transformers padded batches")
        rates["transformers"] = run_transformers(model, prompts, workload, batch)
        bar.update()
    base = rates["continuous"]
    figures = {"model": label, "requests": n, "batch_size": batch, "output_tokens": sum(r.output_len for r in workload),
               "tokens_per_s": rates, "continuous_vs": {k: base / v for k, v in rates.items() if k != "continuous"},
               "outputs_identical_across_policies": all(o == outputs["continuous"] for o in outputs.values())}
    print(f"{machine_line(conditions)}\nmodel: {label}; {n} requests (prompt 8-320, output 4-192 tokens, log-normal), "
          f"batch size {batch}")
    print_table([{"variant": k, "output tok/s": v, "continuous speedup": base / v} for k, v in rates.items()],
                "offline throughput")
    print(f"\ngreedy outputs identical across minillm policies: {figures['outputs_identical_across_policies']}")
    write_json(json_path, "throughput", figures, conditions)
    return figures
