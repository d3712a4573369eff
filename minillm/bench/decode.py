"""Single-stream decode speed on a model of SmolLM2-135M's shape (random weights), or --model's.

Measured side by side in one run, same weights, same greedy tokens:
  * minillm with its KV cache: decode tokens/s = 1 / TPOT
  * the bare loop: per token, every weight matrix once as a matrix-vector product (q/k/v, o,
    gate/up and down of every layer, then the LM head), on the model's own weights, with nothing
    else: no norms, attention, sampling or engine. Decode at batch 1 must stream every weight once
    per token, so this loop is its practical ceiling on this machine.
  * transformers `generate` (its own KV cache): decode tokens/s from generate(N) - generate(1)
  * minillm without a KV cache: every step recomputes the whole sequence
then where one decode step's time goes (the engine times its phases: LLMEngine.step), and the
per-step time of cached decode vs recompute at growing context lengths.
Achieved memory bandwidth = bytes of weights read per token x tokens/s.
"""
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from minillm import LLM, EngineConfig, SamplingParams
from minillm.bench import print_table, progress, write_json
from minillm.bench.conditions import check_conditions, machine_line
from minillm.bench.registry import SMOLLM_SHAPE
from minillm.engine.engine import LLMEngine
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


@torch.inference_mode()
def bare_loop(model: torch.nn.Module, new: int) -> float:
    """The ceiling: `new` tokens of nothing but the model's matrix-vector products. -> tokens/s.
    Each product's output is cut to the next one's input size, so data flows through every layer
    as in the real model, and every weight is read once per token."""
    layers = [(layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj)
              for layer in model.model.layers]
    cfg = model.config
    width, inter = cfg.num_attention_heads * cfg.head_dim, cfg.intermediate_size
    head = model.lm_head.weight
    x = torch.zeros(1, cfg.hidden_size, dtype=head.dtype, device=head.device)

    def token(x):
        for qkv, o, gate_up, down in layers:
            x = down(gate_up(o(qkv(x)[:, :width]))[:, :inter])
        return F.linear(x, head)

    token(x)  # warm-up
    start = time.perf_counter()
    for _ in range(new):
        token(x)
    return new / (time.perf_counter() - start)


def steps_against_bare_loop(llm: LLM, prompt: list[int], rounds: int, chunk: int = 2) -> list[tuple[float, float]]:
    """Paired, so that this machine's drifting speed hits both alike: `chunk` decode steps of the
    engine, then `chunk` tokens of the bare loop, `rounds` times. -> (engine, bare) tokens/s per round."""
    engine = llm.engine
    engine.add_request(prompt, SamplingParams(max_tokens=rounds * chunk + 2, temperature=0, ignore_eos=True))
    engine.step()  # the prefill
    pairs = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(chunk):
            engine.step()
        pairs.append((chunk / (time.perf_counter() - start), bare_loop(llm.model, chunk)))
    while engine.has_unfinished():
        engine.step()
    return pairs


def step_breakdown(llm: LLM, prompt: list[int], steps: int) -> tuple[dict[str, float], dict[str, float]]:
    """Median seconds per phase of a decode step (the engine's own step timings, with attention
    timed apart) -> (without observers, with one observer subscribed)."""
    config = EngineConfig(model=llm.config.model, dtype="float32", device="cpu", profile_attention=True)
    engine = LLMEngine(config, model=llm.model)  # the same weights, timing switched on
    out = []
    for observed in (False, True):
        observer = (lambda event: None)
        if observed:
            engine.subscribe(observer)
        engine.add_request(prompt, SamplingParams(max_tokens=steps + 2, temperature=0, ignore_eos=True))
        engine.step()  # the prefill
        phases, totals = [], []
        while engine.has_unfinished():
            start = time.perf_counter()
            engine.step()
            totals.append(time.perf_counter() - start)
            phases.append(engine.last_step_timings)
        if observed:
            engine.unsubscribe(observer)
        median = {k: statistics.median(p[k] for p in phases) for k in phases[0]}
        out.append({**median, "step": statistics.median(totals)})
    return out[0], out[1]


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
    prompt_len, new, repeats, pair_rounds = (64, 32, 1, 10) if quick else (128, 64, 5, 40)
    llm = LLM(model_dir, dtype="float32", device="cpu")
    contexts = [c for c in ([128, 512] if quick else [128, 256, 512, 1024]) if c <= llm.engine.max_model_len]
    max_id = min(4000, llm.model.config.vocab_size)  # prompt token ids, valid in any vocabulary
    params = sum(p.numel() for p in llm.model.parameters())
    weight_bytes = sum(p.numel() * p.element_size() for p in llm.model.parameters())
    prompt = torch.randint(1, max_id, (prompt_len,), generator=torch.Generator().manual_seed(0)).tolist()
    ours, hf_rate, none = [], [], []
    with progress("decode", 3 * repeats + len(contexts) + 2) as bar:
        bar.set_description("decode: minillm steps against the bare loop, paired")
        pairs = steps_against_bare_loop(llm, prompt, pair_rounds)
        bar.update()
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
        bar.set_description("decode: where a step's time goes")
        quiet, observed = step_breakdown(llm, prompt, new)
        bar.update()
        per_context = []
        for c in contexts:
            bar.set_description(f"decode: one token at context {c}, cached vs recompute")
            per_context.append((c, *step_times(llm, c, repeats, max_id)))
            bar.update()
    vs_hf = statistics.median(a / b for a, b in zip(ours, hf_rate))  # paired: run i of each came together
    vs_bare = statistics.median(e / b for e, b in pairs)
    bare = statistics.median(b for _, b in pairs)
    ours, hf_rate, none = (statistics.median(x) for x in (ours, hf_rate, none))
    breakdown = breakdown_rows(quiet, observed)
    figures = {
        "model": f"{label}, {params / 1e6:.1f}M parameters, float32",
        "prompt_tokens": prompt_len, "new_tokens": new, "repeats": repeats, "paired_rounds_vs_bare_loop": pair_rounds,
        "minillm_tokens_per_s": ours, "bare_loop_tokens_per_s": bare, "transformers_tokens_per_s": hf_rate,
        "no_cache_tokens_per_s": none, "minillm_vs_bare_loop": vs_bare, "minillm_vs_transformers": vs_hf,
        "cache_vs_recompute": ours / none, "step_breakdown_ms": {r["phase"]: r["ms per step"] for r in breakdown},
        "greedy_tokens_identical": our_tokens == hf_tokens,
        "achieved_bandwidth_GBps": weight_bytes * ours / 1e9,
        "per_context": [{"context": c, "cached_step_ms": a * 1e3, "recompute_step_ms": b * 1e3, "speedup": b / a}
                        for c, a, b in per_context],
    }
    print(f"{machine_line(conditions)}\nmodel: {figures['model']}")
    print_table([
        {"variant": "minillm (KV cache)", "decode tok/s": ours, "minillm is": "1.00x"},
        {"variant": "bare loop (the ceiling)", "decode tok/s": bare, "minillm is": f"{vs_bare:.0%} of it"},
        {"variant": "transformers generate", "decode tok/s": hf_rate, "minillm is": f"{vs_hf:.2f}x"},
        {"variant": "minillm, no KV cache", "decode tok/s": none, "minillm is": f"{ours / none:.2f}x"},
    ], f"decode, {prompt_len}-token prompt, {new} new tokens, median of {repeats}; ratios are medians of "
       f"paired runs (the bare loop: {pair_rounds} pairs of 2 steps)")
    print_table(breakdown, f"one decode step at about {prompt_len + new // 2} tokens of context (median of {new})")
    print_table([{"context": c, "cached ms/token": a * 1e3, "recompute ms/token": b * 1e3, "cache speedup": b / a}
                 for c, a, b in per_context], "one new token at a given context length")
    print(f"\nminillm / bare loop: {figures['minillm_vs_bare_loop']:.0%}   "
          f"minillm / transformers: {figures['minillm_vs_transformers']:.2f}x   "
          f"greedy tokens identical: {figures['greedy_tokens_identical']}")
    print(f"achieved weight bandwidth: {figures['achieved_bandwidth_GBps']:.1f} GB/s "
          f"({weight_bytes / 1e6:.0f} MB of weights per token)")
    write_json(json_path, "decode", figures, conditions)
    return figures


PHASES = [("schedule", "scheduler (who runs, KV blocks)"), ("prepare", "step tensors (ids, positions, slots)"),
          ("model", "model forward + logits"), ("attention", "  of which attention"),
          ("sample", "sampler"), ("update", "detokenizer + stop checks"), ("telemetry", "telemetry")]


def breakdown_rows(quiet: dict[str, float], observed: dict[str, float]) -> list[dict]:
    """The phases of one step, the step as timed from outside, and telemetry with an observer."""
    rows = [{"phase": label, "ms per step": quiet[key] * 1e3, "share": f"{quiet[key] / quiet['step']:.1%}"}
            for key, label in PHASES]
    rows[-1]["phase"] = "telemetry, no observer"
    rows.append({"phase": "telemetry, one observer", "ms per step": observed["telemetry"] * 1e3,
                 "share": f"{observed['telemetry'] / observed['step']:.1%}"})
    rows.append({"phase": "whole step (timed outside)", "ms per step": quiet["step"] * 1e3, "share": "100%"})
    return rows
