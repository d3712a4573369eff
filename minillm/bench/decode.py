"""Single-stream decode speed on a model of SmolLM2-135M's shape (random weights).

Measured side by side in one run, same weights, same greedy tokens:
  * minillm with its KV cache: decode tokens/s = 1 / TPOT
  * transformers `generate` (its own KV cache): decode tokens/s from generate(N) - generate(1)
  * minillm without a KV cache: every step recomputes the whole sequence
and the per-step time of cached decode vs recompute at growing context lengths.
Achieved memory bandwidth = bytes of weights read per token x tokens/s: decode at batch 1 must
stream every weight once per token, so this is how close it runs to the memory roofline.
"""
import statistics
import tempfile
import time
from pathlib import Path

import torch

from minillm import LLM, SamplingParams
from minillm.bench import print_table, write_json
from minillm.perf import machine
from minillm.perf import median_time
from minillm.testing import SMOLLM2_135M_SHAPE, make_hf_model


def minillm_decode(llm: LLM, prompt: list[int], new: int) -> tuple[float, list[int]]:
    out = llm.generate([prompt], SamplingParams(max_tokens=new, temperature=0, ignore_eos=True))[0]
    return 1 / out.metrics["tpot"], out.token_ids


@torch.inference_mode()
def hf_decode(hf, prompt: list[int], new: int) -> tuple[float, list[int]]:
    ids = torch.tensor([prompt])
    kwargs = dict(do_sample=False, eos_token_id=None, pad_token_id=0)
    start = time.perf_counter()
    hf.generate(ids, max_new_tokens=1, **kwargs)
    prefill = time.perf_counter() - start
    start = time.perf_counter()
    tokens = hf.generate(ids, max_new_tokens=new, **kwargs)[0, len(prompt):].tolist()
    return (new - 1) / (time.perf_counter() - start - prefill), tokens


def no_cache_decode(llm: LLM, prompt: list[int], new: int) -> float:
    """Greedy decode that recomputes the full sequence for every token (what a cache saves)."""
    ids = list(prompt)
    start = None
    for i in range(new):
        ids.append(int(llm.logits(ids)[-1].argmax()))
        if i == 0:
            start = time.perf_counter()  # like TPOT: time after the first token
    return (new - 1) / (time.perf_counter() - start)


def step_times(llm: LLM, context: int, repeats: int) -> tuple[float, float]:
    """Seconds for one new token at `context` tokens: cached decode step vs full recompute."""
    gen = torch.Generator().manual_seed(context)
    prompt = torch.randint(1, 4000, (context - 8,), generator=gen).tolist()
    cached = []
    for _ in range(repeats):
        out = llm.generate([prompt], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))[0]
        cached.append(statistics.median(out.metrics["itl"]))
    recompute = median_time(lambda: llm.logits(prompt + [1] * 8), repeats)
    return statistics.median(cached), recompute


def run(quick: bool = False, json_path: str | None = None) -> dict:
    prompt_len, new, repeats = (64, 32, 1) if quick else (128, 128, 3)
    contexts = [128, 512] if quick else [128, 256, 512, 1024]
    with tempfile.TemporaryDirectory() as tmp:
        hf = make_hf_model(Path(tmp), "llama", **SMOLLM2_135M_SHAPE)
        llm = LLM(tmp, dtype="float32", device="cpu")
        params = sum(p.numel() for p in llm.model.parameters())
        weight_bytes = sum(p.numel() * p.element_size() for p in llm.model.parameters())
        prompt = torch.randint(1, 4000, (prompt_len,), generator=torch.Generator().manual_seed(0)).tolist()
        ours, hf_rate, none = [], [], []
        for _ in range(repeats):  # interleaved, so drifting machine load hits every variant alike
            rate, our_tokens = minillm_decode(llm, prompt, new)
            ours.append(rate)
            rate, hf_tokens = hf_decode(hf, prompt, new)
            hf_rate.append(rate)
            none.append(no_cache_decode(llm, prompt, new))
        per_context = [(c, *step_times(llm, c, repeats)) for c in contexts]
    ours, hf_rate, none = statistics.median(ours), statistics.median(hf_rate), statistics.median(none)
    figures = {
        "model": f"SmolLM2-135M shape, random weights, {params / 1e6:.1f}M parameters, float32",
        "prompt_tokens": prompt_len, "new_tokens": new, "repeats": repeats,
        "minillm_tokens_per_s": ours, "transformers_tokens_per_s": hf_rate, "no_cache_tokens_per_s": none,
        "minillm_vs_transformers": ours / hf_rate, "cache_vs_recompute": ours / none,
        "greedy_tokens_identical": our_tokens == hf_tokens,
        "achieved_bandwidth_GBps": weight_bytes * ours / 1e9,
        "per_context": [{"context": c, "cached_step_ms": a * 1e3, "recompute_step_ms": b * 1e3, "speedup": b / a}
                        for c, a, b in per_context],
    }
    print(f"machine: {machine()}\nmodel: {figures['model']}")
    print_table([
        {"variant": "minillm (KV cache)", "decode tok/s": ours, "ratio": 1.0},
        {"variant": "transformers generate", "decode tok/s": hf_rate, "ratio": hf_rate / ours},
        {"variant": "minillm, no KV cache", "decode tok/s": none, "ratio": none / ours},
    ], f"decode, {prompt_len}-token prompt, {new} new tokens, median of {repeats}")
    print_table([{"context": c, "cached ms/token": a * 1e3, "recompute ms/token": b * 1e3, "cache speedup": b / a}
                 for c, a, b in per_context], "one new token at a given context length")
    print(f"\nminillm / transformers: {figures['minillm_vs_transformers']:.2f}x   "
          f"greedy tokens identical: {figures['greedy_tokens_identical']}")
    print(f"achieved weight bandwidth: {figures['achieved_bandwidth_GBps']:.1f} GB/s "
          f"({weight_bytes / 1e6:.0f} MB of weights per token)")
    write_json(json_path, "decode", figures)
    return figures
