"""Single-stream decode speed on a model of SmolLM2-135M's shape (random weights), or --model's.

Measured side by side in one run, same weights, same greedy tokens:
  * minillm with its KV cache: decode tokens/s = 1 / TPOT
  * the same with its decode steps compiled (EngineConfig.from_knobs(compile_decode=True), engine/compiled.py;
    not in --quick: compiling takes minutes on a 2-core CPU, under one once inductor's cache holds it)
  * the bare loop: per token, every weight matrix once as a matrix-vector product (q/k/v, o,
    gate/up and down of every layer, then the LM head), on the model's own weights, with nothing
    else: no norms, attention, sampling or engine. Decode at batch 1 must stream every weight once
    per token, so this loop is its practical ceiling on this machine.
  * transformers `generate` (its own KV cache): decode tokens/s from generate(N) - generate(1)
  * minillm without a KV cache: every step recomputes the whole sequence
  * llama.cpp (bench/anchors.py), when installed and the model is the packaged SmolLM2: the same weights
    from an F32 GGUF file (the same bytes per token as minillm's float32), interleaved with minillm
then where one decode step's time goes (the engine times its phases: LLMEngine.step), and the
per-step time of cached decode vs recompute at growing context lengths.
Achieved memory bandwidth = bytes of weights read per token x tokens/s.
"""
import statistics
import tempfile
import time
from pathlib import Path

import torch

from minillm import LLM, EngineConfig, SamplingParams
from minillm.bench import SMALLER_QUICK, is_big, print_table, progress, write_json
from minillm.bench.anchors import open_anchors
from minillm.bench.catalog import SMOLLM_SHAPE
from minillm.bench.conditions import check_conditions, machine_line
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
    head = model.lm_head  # the engine's own module: the product the engine runs (the C++ few-row product on a CPU)
    x = torch.zeros(1, cfg.hidden_size, dtype=head.weight.dtype, device=head.weight.device)

    def token(x):
        for qkv, o, gate_up, down in layers:
            x = down(gate_up(o(qkv(x)[:, :width]))[:, :inter])
        return head(x)

    token(x)  # warm-up
    start = time.perf_counter()
    for _ in range(new):
        token(x)
    return new / (time.perf_counter() - start)


def agreeing_prefix(a: list[int], b: list[int]) -> int:
    """How many tokens two greedy outputs share before they first differ (float rounding can flip a near-tie)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def steps_against_bare_loop(llms: list[LLM], prompt: list[int], rounds: int,
                            chunk: int = 2) -> list[tuple[float, ...]]:
    """Paired, so that this machine's drifting speed hits every variant alike: `chunk` decode steps of
    each engine, then `chunk` tokens of the bare loop (on the first one's weights), `rounds` times.
    -> (each engine's tokens/s..., the bare loop's) per round."""
    engines = [llm.engine for llm in llms]
    for engine in engines:
        engine.add_request(prompt, SamplingParams(max_tokens=rounds * chunk + 2, temperature=0, ignore_eos=True))
        engine.step()  # the prefill
    rounds_out = []
    for _ in range(rounds):
        rates = []
        for engine in engines:
            start = time.perf_counter()
            for _ in range(chunk):
                engine.step()
            rates.append(chunk / (time.perf_counter() - start))
        rounds_out.append((*rates, bare_loop(llms[0].model, chunk)))
    for engine in engines:
        while engine.has_unfinished():
            engine.step()
    return rounds_out


def step_breakdown(llm: LLM, prompt: list[int], steps: int) -> tuple[dict[str, float], dict[str, float]]:
    """Median seconds per phase of a decode step (the engine's own step timings) -> (without observers, with one
    observer subscribed). Attention is timed on a second engine with profile_attention, whose clock reads per layer
    run the layers one call at a time (a CPU decode step's C++ layer has no seam to time attention at)."""
    config = dict(model=llm.config.model, dtype="float32", device="cpu")
    engine = LLMEngine(EngineConfig.from_knobs(**config), model=llm.model)  # the same weights
    quiet, observed = (timed_steps(engine, prompt, steps, watched) for watched in (False, True))
    profiled = LLMEngine(EngineConfig.from_knobs(**config, profile_attention=True), model=llm.model)
    quiet["attention"] = timed_steps(profiled, prompt, steps, False)["attention"]
    return quiet, observed


def timed_steps(engine: LLMEngine, prompt: list[int], steps: int, watched: bool) -> dict[str, float]:
    """`steps` decode steps after the prompt's prefill -> the median of each phase and of the whole step, with an
    observer subscribed if `watched`."""
    observer = (lambda event: None)
    if watched:
        engine.subscribe(observer)
    engine.add_request(prompt, SamplingParams(max_tokens=steps + 2, temperature=0, ignore_eos=True))
    engine.step()  # the prefill
    phases, totals = [], []
    while engine.has_unfinished():
        start = time.perf_counter()
        engine.step()
        totals.append(time.perf_counter() - start)
        phases.append(engine.last_step_timings)
    if watched:
        engine.unsubscribe(observer)
    return {**{k: statistics.median(p[k] for p in phases) for k in phases[0]}, "step": statistics.median(totals)}


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
    big = quick and is_big(model_dir)
    prompt_len, new, repeats, pair_rounds = (32, 16, 1, 6) if big else (64, 32, 1, 10) if quick else (128, 64, 5, 40)
    llm = LLM(model_dir, dtype="float32", device="cpu")
    quick_contexts = [128, 256] if big else [128, 512]
    contexts = [c for c in (quick_contexts if quick else [128, 256, 512, 1024]) if c <= llm.engine.max_model_len]
    max_id = min(4000, llm.model.config.vocab_size)  # prompt token ids, valid in any vocabulary
    params = sum(p.numel() for p in llm.model.parameters())
    weight_bytes = sum(p.numel() * p.element_size() for p in llm.model.parameters())
    prompt = torch.randint(1, max_id, (prompt_len,), generator=torch.Generator().manual_seed(0)).tolist()
    variants = {"minillm": llm}
    rates: dict[str, list[float]] = {"minillm": [], "compiled": [], "transformers": [], "no cache": []}
    tokens = {}
    with (open_anchors(label, ("F32",), torch.get_num_threads()) as (anchors, no_anchors),
          progress("decode", (3 + (not quick) + len(anchors)) * repeats + len(contexts) + 3) as bar):
        rates.update({name: [] for name in anchors})
        if not quick:
            bar.set_description("decode: compiling minillm's decode step (torch.compile)")
            start = time.perf_counter()
            variants["compiled"] = LLM(model_dir, dtype="float32", device="cpu", compile_decode=True)
            minillm_decode(variants["compiled"], prompt, 2)
            compile_seconds = time.perf_counter() - start
        bar.update()
        bar.set_description("decode: minillm steps against the bare loop, paired")
        rounds = steps_against_bare_loop(list(variants.values()), prompt, pair_rounds)
        bar.update()
        for rep in range(repeats):  # interleaved, so drifting machine load hits every variant alike
            for name, variant in variants.items():
                bar.set_description(f"decode: {name} (KV cache), run {rep + 1}/{repeats}")
                rate, tokens[name] = minillm_decode(variant, prompt, new)
                rates[name].append(rate)
                bar.update()
            bar.set_description(f"decode: transformers generate, run {rep + 1}/{repeats}")
            rate, tokens["transformers"] = hf_decode(hf, prompt, new)
            rates["transformers"].append(rate)
            bar.update()
            bar.set_description(f"decode: minillm, no KV cache, run {rep + 1}/{repeats}")
            rates["no cache"].append(no_cache_decode(llm, prompt, new))
            bar.update()
            for name, anchor in anchors.items():
                bar.set_description(f"decode: {name}, run {rep + 1}/{repeats}")
                rate, tokens[name] = anchor.decode(prompt, new)
                rates[name].append(rate)
                bar.update()
        bar.set_description("decode: where a step's time goes")
        quiet, observed = step_breakdown(llm, prompt, new)
        bar.update()
        per_context = []
        for c in contexts:
            bar.set_description(f"decode: one token at context {c}, cached vs recompute")
            per_context.append((c, *step_times(llm, c, repeats, max_id)))
            bar.update()
    # Ratios are medians of paired runs: run (or round) i of each variant came together.
    vs_hf = {name: statistics.median(a / b for a, b in zip(rates[name], rates["transformers"])) for name in variants}
    vs_anchor = {name: statistics.median(a / b for a, b in zip(rates["minillm"], rates[name])) for name in anchors}
    vs_bare = {name: statistics.median(r[i] / r[-1] for r in rounds) for i, name in enumerate(variants)}
    bare = statistics.median(r[-1] for r in rounds)
    rate = {name: statistics.median(x) for name, x in rates.items() if x}
    ours, none = rate["minillm"], rate["no cache"]
    breakdown = breakdown_rows(quiet, observed)
    figures = {
        "model": f"{label}, {params / 1e6:.1f}M parameters, float32",
        "smaller_quick_workload": big, "prompt_tokens": prompt_len, "new_tokens": new, "repeats": repeats,
        "paired_rounds_vs_bare_loop": pair_rounds,
        "minillm_tokens_per_s": ours, "bare_loop_tokens_per_s": bare, "transformers_tokens_per_s": rate["transformers"],
        "no_cache_tokens_per_s": none, "minillm_vs_bare_loop": vs_bare["minillm"],
        "minillm_vs_transformers": vs_hf["minillm"], "cache_vs_recompute": ours / none,
        "step_breakdown_ms": {r["phase"]: r["ms per step"] for r in breakdown},
        "greedy_tokens_identical": all(tokens[name] == tokens["transformers"] for name in variants),
        "llama_cpp": {name: {"tokens_per_s": rate[name], "minillm_vs_it": vs_anchor[name],
                             "greedy_tokens_agree": agreeing_prefix(tokens[name], tokens["minillm"])}
                      for name in anchors} or no_anchors,
        "achieved_bandwidth_GBps": weight_bytes * ours / 1e9,
        "per_context": [{"context": c, "cached_step_ms": a * 1e3, "recompute_step_ms": b * 1e3, "speedup": b / a}
                        for c, a, b in per_context],
    }
    if "compiled" in variants:
        figures.update({"compiled_tokens_per_s": rate["compiled"], "compiled_vs_bare_loop": vs_bare["compiled"],
                        "compiled_vs_transformers": vs_hf["compiled"], "compile_seconds": compile_seconds})
    print(f"{machine_line(conditions)}\nmodel: {figures['model']}")
    if big:
        print(f"--quick: {SMALLER_QUICK} ({weight_bytes / 1e6:.0f} MB of weights): a {prompt_len}-token prompt, "
              f"{new} new tokens, {pair_rounds} paired rounds, contexts {', '.join(map(str, contexts))}")
    rows = [{"variant": "minillm (KV cache)", "decode tok/s": ours, "of the bare loop": f"{vs_bare['minillm']:.0%}",
             "vs transformers": f"{vs_hf['minillm']:.2f}x"}]
    if "compiled" in variants:
        rows.append({"variant": f"minillm, compiled decode ({compile_seconds:.0f} s to compile)",
                     "decode tok/s": rate["compiled"], "of the bare loop": f"{vs_bare['compiled']:.0%}",
                     "vs transformers": f"{vs_hf['compiled']:.2f}x"})
    rows += [{"variant": "bare loop (the ceiling)", "decode tok/s": bare, "of the bare loop": "100%",
              "vs transformers": ""},
             {"variant": "transformers generate", "decode tok/s": rate["transformers"], "of the bare loop": "",
              "vs transformers": "1.00x"},
             {"variant": "minillm, no KV cache", "decode tok/s": none, "of the bare loop": "",
              "vs transformers": ""}]
    rows += [{"variant": f"{name} (minillm {vs_anchor[name]:.2f}x it)", "decode tok/s": rate[name],
              "of the bare loop": "", "vs transformers": ""} for name in anchors]
    print_table(rows, f"decode, {prompt_len}-token prompt, {new} new tokens, median of {repeats}; ratios are medians "
                      f"of paired runs (the bare loop: {pair_rounds} rounds of 2 steps)"
                      + ("; --quick leaves out the compiled decode" if quick else ""))
    print_table(breakdown, f"one decode step at about {prompt_len + new // 2} tokens of context (median of {new})")
    print_table([{"context": c, "cached ms/token": a * 1e3, "recompute ms/token": b * 1e3, "cache speedup": b / a}
                 for c, a, b in per_context], "one new token at a given context length")
    summary = [f"minillm / bare loop: {vs_bare['minillm']:.0%}", f"minillm / transformers: {vs_hf['minillm']:.2f}x"]
    if "compiled" in variants:
        summary += [f"compiled / bare loop: {vs_bare['compiled']:.0%}",
                    f"compiled / transformers: {vs_hf['compiled']:.2f}x"]
    print("\n" + "   ".join(summary + [f"greedy tokens identical: {figures['greedy_tokens_identical']}"]))
    if no_anchors:
        print(f"no llama.cpp rows: {no_anchors}")
    for name in anchors:
        # Both ratios have minillm on top, each measured in pairs: their quotient puts llama.cpp against the ceiling.
        figures["llama_cpp"][name]["of_the_bare_loop"] = vs_bare["minillm"] / vs_anchor[name]
        print(f"minillm / {name}: {vs_anchor[name]:.2f}x ({name} runs at "
              f"{figures['llama_cpp'][name]['of_the_bare_loop']:.0%} of the bare loop); "
              f"greedy tokens equal to minillm's until the first difference: "
              f"{figures['llama_cpp'][name]['greedy_tokens_agree']}/{new}")
    print(f"no KV cache: the cache makes decode {ours / none:.2f}x faster")
    print(f"achieved weight bandwidth: {figures['achieved_bandwidth_GBps']:.1f} GB/s "
          f"({weight_bytes / 1e6:.0f} MB of weights per token)")
    write_json(json_path, "decode", figures, conditions)
    return figures


PHASES = [("schedule", "scheduler (who runs, KV blocks)"), ("prepare", "step tensors (ids, positions, slots)"),
          ("model", "model forward + logits"), ("attention", "  of which attention (timed apart)"),
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
