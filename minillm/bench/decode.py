"""Single-stream decode speed on a model of SmolLM2-135M's shape (random weights), or --model's.

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
from minillm.bench import print_table, progress, write_json
from minillm.bench.conditions import check_conditions, machine_line
from minillm.bench.registry import SMOLLM_SHAPE
from minillm.models.registry import resolve_model_path
from minillm.perf import median_time
from minillm.testing import SMOLLM2_135M_SHAPE, make_hf_model


def minillm_decode(llm: LLM, prompt: list[int], new: int) -> tuple[float, list[int]]:
    out = llm.generate([prompt], SamplingParams(max_tokens=new, temperature=0, ignore_eos=True), use_tqdm=False)[0]
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


def step_times(llm: LLM, context: int, repeats: int, max_id: int = 4000) -> tuple[float, float]:
    """Seconds for one new token at `context` tokens: cached decode step vs full recompute."""
    gen = torch.Generator().manual_seed(context)
    prompt = torch.randint(1, max_id, (context - 8,), generator=gen).tolist()
    cached = []
    for _ in range(repeats):
        out = llm.generate([prompt], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True), use_tqdm=False)[0]
        cached.append(statistics.median(out.metrics["itl"]))
    recompute = median_time(lambda: llm.logits(prompt + [1] * 8), repeats)
    return statistics.median(cached), recompute


def run(quick: bool = False, json_path: str | None = None, model: str | None = None) -> dict:
    """model: a bundled name or a Hugging Face directory (transformers loads the same files);
    None: a random checkpoint of SmolLM2-135M's shape, built with transformers."""
    conditions = check_conditions()
    if model is None:
        with tempfile.TemporaryDirectory() as tmp:
            hf = make_hf_model(Path(tmp), "llama", **SMOLLM2_135M_SHAPE)
            return measure(tmp, hf, SMOLLM_SHAPE, quick, json_path, conditions)
    import transformers
    path = resolve_model_path(model)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return measure(str(path), hf, model, quick, json_path, conditions)


def measure(model_dir: str, hf, label: str, quick: bool, json_path: str | None, conditions: dict) -> dict:
    prompt_len, new, repeats = (64, 32, 1) if quick else (128, 128, 3)
    llm = LLM(model_dir, dtype="float32", device="cpu")
    contexts = [c for c in ([128, 512] if quick else [128, 256, 512, 1024]) if c <= llm.engine.max_model_len]
    max_id = min(4000, llm.model.config.vocab_size)  # prompt token ids, valid in any vocabulary
    params = sum(p.numel() for p in llm.model.parameters())
    weight_bytes = sum(p.numel() * p.element_size() for p in llm.model.parameters())
    prompt = torch.randint(1, max_id, (prompt_len,), generator=torch.Generator().manual_seed(0)).tolist()
    ours, hf_rate, none = [], [], []
    with progress("decode", 3 * repeats + len(contexts)) as bar:
        for rep in range(repeats):  # interleaved, so drifting machine load hits every variant alike
            bar.set_description(f"decode: minillm (KV cache), run {rep + 1}/{repeats}")
            rate, our_tokens = minillm_decode(llm, prompt, new)
            ours.append(rate)
            bar.update()
            bar.set_description(f"decode: transformers generate, run {rep + 1}/{repeats}")
            rate, hf_tokens = hf_decode(hf, prompt, new)
            hf_rate.append(rate)
            bar.update()
            bar.set_description(f"decode: minillm, no KV cache, run {rep + 1}/{repeats}")
            none.append(no_cache_decode(llm, prompt, new))
            bar.update()
        per_context = []
        for c in contexts:
            bar.set_description(f"decode: one token at context {c}, cached vs recompute")
            per_context.append((c, *step_times(llm, c, repeats, max_id)))
            bar.update()
    ours, hf_rate, none = statistics.median(ours), statistics.median(hf_rate), statistics.median(none)
    figures = {
        "model": f"{label}, {params / 1e6:.1f}M parameters, float32",
        "prompt_tokens": prompt_len, "new_tokens": new, "repeats": repeats,
        "minillm_tokens_per_s": ours, "transformers_tokens_per_s": hf_rate, "no_cache_tokens_per_s": none,
        "minillm_vs_transformers": ours / hf_rate, "cache_vs_recompute": ours / none,
        "greedy_tokens_identical": our_tokens == hf_tokens,
        "achieved_bandwidth_GBps": weight_bytes * ours / 1e9,
        "per_context": [{"context": c, "cached_step_ms": a * 1e3, "recompute_step_ms": b * 1e3, "speedup": b / a}
                        for c, a, b in per_context],
    }
    print(f"{machine_line(conditions)}\nmodel: {figures['model']}")
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
    write_json(json_path, "decode", figures, conditions)
    return figures
