"""Weight-only quantization: what each scheme costs in quality, saves in bytes and does to decode speed;
which layers and projections are sensitive; and whether quantizing more ever gives a lower error.

Measured side by side in one run, on the same held-out windows (eval.Reference):
  * the kernels: every candidate matmul of each scheme at the model's own shapes and 1-16 rows of x
    (experiments/quant_kernel_choice.py), the evidence for the fused CPU path QuantizedLinear takes by default;
  * the full-precision model and each scheme (int8; int4 at group sizes 32, 64, 128, with the range
    holding 0 and min-max; AWQ; fp8 where torch has float8_e4m3fn): perplexity, KL(full ||
    quantized), top-1 agreement, the bytes of the quantized matrices (codes, scales and zero points)
    against float32, the whole model's bytes, and greedy decode tokens/s at batch 1 at each thread
    count (the engine, one prompt, interleaved repetitions; the ratio to full precision is the median
    of each repetition's ratio), the reference kernel beside the fused one;
  * sensitivity: each decoder layer alone and each projection type alone, then growing sets of
    layers in the orders most-sensitive-first, least-sensitive-first and seeded random ones;
  * the cancellation search (experiments/quant_cancellation.py) over every set measured, with every subset of
    layers for the most aggressive scheme when the model has at most 6 layers.
"""
import copy
import dataclasses
import os
import statistics
import time

import torch

from minillm import LLM
from minillm.bench import SMALLER_QUICK, is_big, print_table, progress, write_json
from minillm.bench.anchors import open_anchors
from minillm.bench.conditions import check_conditions, machine_line
from minillm.bench.decode import minillm_decode
from minillm.config import CacheConfig
from minillm.experiments import quant_kernel_choice as kernel_choice
from minillm.experiments.quant_cancellation import MAX_EXHAUSTIVE_UNITS, Search, paired_difference, search
from minillm.experiments.quant_quality import Quality, Reference, heldout_windows
from minillm.experiments.quant_sensitivity import quantized_copy
from minillm.models.registry import resolve_model_path
from minillm.quant import QuantConfig, linear_weight_bytes, quantize_model
from minillm.quant.awq import apply_awq, calibration_rows
from minillm.quant.codecs import FP8_DTYPE
from minillm.quant.quant_config import LAYER_PROJECTIONS, PROJECTIONS

ANCHOR_KINDS = ("F32", "Q8_0", "Q4_1")  # llama.cpp's files of the same weights (bench/anchors.py)
ANCHOR_PAIRS = (("full", "llama.cpp F32"), ("int8", "llama.cpp Q8_0"), ("int8+head", "llama.cpp Q8_0"),
                ("int4-g32-minmax", "llama.cpp Q4_1"), ("int4-g32-minmax+head", "llama.cpp Q4_1"),
                # --quick runs group 64 only: Q4_1's format (a scale and a minimum) on groups twice as long
                ("int4-g64-minmax", "llama.cpp Q4_1"), ("int4-g64-minmax+head", "llama.cpp Q4_1"))


@dataclasses.dataclass(frozen=True)
class Settings:
    windows: int                         # held-out windows scored by every measurement
    window_tokens: int                   # tokens scored per window
    group_sizes: tuple[int, ...]         # int4 group sizes in the schemes table
    fp8: bool                            # fp8 in the schemes table (where torch has it)
    prompt_tokens: int                   # the decode prompt
    new_tokens: int
    repeats: int                         # interleaved decode repetitions
    searched: tuple[tuple[str, int], ...]  # (scheme, group size) of the sensitivity sections, most aggressive first
    seeds: tuple[int, ...]               # random orders of the growing sets
    exhaustive: bool                     # every subset of layers for the first searched scheme
    awq: tuple[tuple[int, str], ...] = ()  # (group size, int4_range) of the AWQ-calibrated int4 rows
    threads: tuple[int, ...] = (1,)      # torch threads of a full run's decode measurements (those the CPUs have)
    kernel_repeats: int = 3              # sweeps per kernel timing
    kernel_rows: tuple[int, ...] = kernel_choice.ROWS  # rows of x in the kernel timings
    inductor: bool = False               # time torch.compile's dequantize-matvec too (it compiles per shape)


FULL = Settings(windows=20, window_tokens=256, group_sizes=(32, 64, 128), fp8=True, prompt_tokens=64,
                new_tokens=32, repeats=5, searched=(("int4", 32), ("int4", 64), ("int8", 0)), seeds=(0, 1, 2),
                exhaustive=True, awq=((64, "holds-zero"), (32, "min-max")), threads=(1, 2), kernel_repeats=5,
                inductor=True)
QUICK = Settings(windows=4, window_tokens=128, group_sizes=(64,), fp8=False, prompt_tokens=32, new_tokens=16,
                 repeats=2, searched=(("int4", 32),), seeds=(0, 1, 2), exhaustive=False, kernel_repeats=5)
# --quick on a big model: fewer windows and tokens, and no random orders (each growing set is a copy of the model)
QUICK_BIG = dataclasses.replace(QUICK, windows=2, window_tokens=32, prompt_tokens=16, new_tokens=8, seeds=(),
                                kernel_repeats=2, kernel_rows=(1, 8))  # the kernels at 1-16 rows took 31 s of 94
# a full run on a big model: the schemes (AWQ too), the kernels and decode at both thread counts, on enough
# tokens to tell the int4 codecs apart; no sensitivity sections (30 layers: hours of model copies)
FULL_BIG = dataclasses.replace(QUICK, group_sizes=(32, 64), prompt_tokens=32, new_tokens=24, repeats=5, searched=(),
                               seeds=(), awq=((64, "holds-zero"), (32, "min-max")), threads=(1, 2), kernel_repeats=3)

def unfit_group(group_size: int, config) -> str | None:
    """Why int4 at group_size cannot quantize this model (a matrix's input size it does not divide), or None."""
    inputs = {"hidden_size": config.hidden_size, "intermediate_size": config.intermediate_size,
              "num_attention_heads x head_dim": config.num_attention_heads * config.head_dim}
    bad = [f"{name} {n}" for name, n in inputs.items() if n % group_size]
    return f"int4-g{group_size} skipped: group size {group_size} does not divide {', '.join(bad)}" if bad else None


def configs(specs, config, notes: list[str]) -> list[QuantConfig]:
    """QuantConfigs of (scheme, group size) specs that fit this model; a note for each that does not."""
    out = []
    for scheme, group in specs:
        why = unfit_group(group, config) if scheme == "int4" else None
        if scheme == "fp8" and FP8_DTYPE is None:
            why = f"fp8 skipped: this torch ({torch.__version__}) has no float8_e4m3fn"
        if why and why not in notes:
            notes.append(why)
        if not why:
            out.append(QuantConfig(scheme, group_size=group or 64))
    return out


def scheme_configs(s: Settings, config, notes: list[str]) -> tuple[list[QuantConfig], list[QuantConfig]]:
    """-> (the schemes whose quality is measured, those whose decode speed is: the uncalibrated ones, and
    the reference kernel of int8 and the first int4 beside the fused default)."""
    plain = configs([("int8", 0), *(("int4", g) for g in s.group_sizes), *([("fp8", 0)] if s.fp8 else [])],
                    config, notes)
    int4 = [c for c in plain if c.scheme == "int4"]
    min_max = [dataclasses.replace(c, int4_range="min-max") for c in int4]
    awq = [dataclasses.replace(c, int4_range=r, calibration="awq")
           for g, r in s.awq for c in configs([("int4", g)], config, notes)]
    # The LM head is a fifth of SmolLM2's bytes: quantized too, in the two schemes that keep the model's quality.
    heads = [dataclasses.replace(c, projections=PROJECTIONS) for c in plain[:1] + min_max[:1]]
    references = [dataclasses.replace(c, kernel="reference") for c in plain[:1] + int4[:1]]
    return plain + min_max + heads + awq, plain + min_max + heads + references


def decode_speeds(model: str, model_dir: str, schemes: list[QuantConfig], prompt: list[int], s: Settings, threads,
                  bar, notes: list[str], full: torch.nn.Module | None = None) -> dict:
    """Greedy decode tokens/s at batch 1 of the full model and each scheme, and of llama.cpp's F32, Q8_0 and Q4_1
    files when it is installed (bench/anchors.py), at each torch thread count, interleaved repetitions in rotating
    order; full: the loaded full-precision weights to share (else loaded here).
    -> threads -> label -> (rates per repetition, the greedy tokens)."""
    tokens = len(prompt) + max(s.new_tokens, 4)
    llms = {"full": batch_one(model_dir, tokens, full)}
    llms.update({c.label(): batch_one(model_dir, tokens, llms["full"].model, quantization=c) for c in schemes})
    out, before = {}, torch.get_num_threads()
    try:
        for t in threads:
            torch.set_num_threads(t)
            with open_anchors(model, ANCHOR_KINDS, t) as (anchors, missing):
                if missing and missing not in notes:
                    notes.append(f"no llama.cpp rows: {missing}")
                runs = {name: (lambda n, llm=llm: minillm_decode(llm, prompt, n)) for name, llm in llms.items()}
                runs.update({name: (lambda n, a=anchor: a.decode(prompt, n)) for name, anchor in anchors.items()})
                names = list(runs)
                for run_one in runs.values():
                    run_one(4)  # warm-up
                out[t] = {name: ([], []) for name in runs}
                for rep in range(s.repeats):
                    for name in names[rep % len(names):] + names[:rep % len(names)]:
                        bar.set_description(f"quant: decode {name}, {t} thread{'s' * (t > 1)}, "
                                            f"run {rep + 1}/{s.repeats}")
                        rate, tokens = runs[name](s.new_tokens)
                        out[t][name][0].append(rate)
                        out[t][name][1][:] = tokens
                        bar.update()
    finally:
        torch.set_num_threads(before)
    return out


def anchor_ratios(speeds: dict) -> list[dict]:
    """minillm's scheme against the llama.cpp file of the same kind, at each thread count: medians of paired runs."""
    rows = []
    for t, by in speeds.items():
        for ours, theirs in ANCHOR_PAIRS:
            if ours in by and theirs in by:
                ratio = statistics.median(a / b for a, b in zip(by[ours][0], by[theirs][0]))
                rows.append({"threads": t, "minillm": ours, "llama.cpp": theirs, "minillm / llama.cpp": ratio})
    return rows


def calibrated_copy(model: torch.nn.Module, config: QuantConfig, model_dir) -> torch.nn.Module:
    """A copy of model scaled by AWQ on the calibration text (as an engine does), then quantized."""
    scaled = copy.deepcopy(model)
    apply_awq(scaled, config, calibration_rows(model_dir))
    return quantize_model(scaled, config)


def batch_one(model_dir: str, tokens: int, weights: torch.nn.Module | None = None, **config) -> LLM:
    """A float32 CPU engine for one sequence of at most `tokens` tokens, its KV pool sized to just that: the
    default pool (256 MiB) in each of the engines side by side would be most of the run's memory. weights: the
    full model's, shared (a quantizing engine copies what it changes) instead of loaded again."""
    block = CacheConfig.block_size
    return LLM(model_dir, weights, dtype="float32", device="cpu", max_num_seqs=1,
               num_kv_blocks=-(-tokens // block) + 1, **config)


def stderr(values) -> float:
    return statistics.stdev(values) / len(values) ** 0.5


def shown(q: Quality) -> dict:
    return {"perplexity": f"{q.perplexity:.3f}", "KL": f"{q.kl:.2e}", "± se": f"{stderr(q.kl_per_window):.1e}",
            "top-1": f"{q.top1:.2%}"}


def layers_label(units) -> str:
    return "{" + ",".join(map(str, sorted(units))) + "}"


def run(quick: bool = False, json_path: str | None = None, model: str | None = None) -> dict:
    model = model or "tiny"
    started, conditions, notes = time.perf_counter(), check_conditions(), []
    path = resolve_model_path(model)
    big = is_big(path)
    s = (QUICK_BIG if big else QUICK) if quick else FULL_BIG if big else FULL
    if big and quick:
        notes.append(f"--quick: {SMALLER_QUICK}: {s.windows} windows of {s.window_tokens} tokens, growing sets in "
                     f"the two sensitivity orders only")
    elif big:
        notes.append(f"a big model: {s.windows} windows of {s.window_tokens} tokens, the schemes and kernels only "
                     f"(the sensitivity sections would take hours of model copies)")
    # --quick decodes at the run's thread count (--threads), a full run at each of its own
    wanted = (torch.get_num_threads(),) if quick else s.threads
    threads = tuple(t for t in wanted if t <= (os.cpu_count() or 1)) or (os.cpu_count() or 1,)
    if threads != wanted:
        notes.append(f"decode at {', '.join(map(str, threads))} thread(s) only: this machine has {os.cpu_count()} CPUs")
    windows = heldout_windows(path, s.windows, s.window_tokens)  # [windows, tokens + 1]
    full = batch_one(str(path), s.window_tokens + 1).model
    schemes, timed = scheme_configs(s, full.config, notes)
    searched = configs(s.searched, full.config, notes)
    if s.exhaustive and len(full.model.layers) > MAX_EXHAUSTIVE_UNITS:
        layers = len(full.model.layers)
        notes.append(f"every-subset search skipped: {layers} decoder layers would be {2 ** layers - 1:,} sets "
                     f"(it takes at most {MAX_EXHAUSTIVE_UNITS} layers); growing sets only")
    kernel_group = next((c.group_size for c in schemes if c.scheme == "int4"), 32)
    with progress("quant", 2 + len(schemes) + (1 + len(timed) + len(ANCHOR_KINDS)) * s.repeats * len(threads),
                  "measurement") as bar:
        bar.set_description("quant: the kernels at the model's shapes")
        kernels = kernel_choice.measure(kernel_choice.model_shapes(full.config), kernel_group, s.kernel_repeats,
                                        s.inductor, s.kernel_rows)
        bar.update()
        bar.set_description("quant: the full model's log-probabilities")
        reference = Reference(full, windows)
        bar.update()
        table = {"full": (reference.quality, linear_weight_bytes(full))}
        for c in schemes:
            bar.set_description(f"quant: {c.label()} quality")
            quantized = calibrated_copy(full, c, path) if c.calibration else quantized_copy(full, c)
            table[c.label()] = (reference.compare(quantized), linear_weight_bytes(quantized))
            del quantized  # before the next copy is made
            bar.update()
        speeds = decode_speeds(model, str(path), timed, windows[0, :s.prompt_tokens].tolist(), s, threads, bar, notes,
                               full)  # one copy of the weights (a second held SmolLM2 twice: 6.3 GB at the peak)
        studies = []
        for i, base in enumerate(searched):
            bar.total += len(LAYER_PROJECTIONS)
            alone = {}
            for p in LAYER_PROJECTIONS:
                bar.set_description(f"quant: {base.label()} {p} alone")
                alone[p] = reference.compare(quantized_copy(full, dataclasses.replace(base, projections=(p,))))
                bar.update()
            studies.append((alone, search(full, reference, base, s.seeds, s.exhaustive and i == 0, bar=bar)))
    return report(model, s, notes, kernels, table, speeds, studies, conditions, json_path,
                  time.perf_counter() - started)


def scheme_rows(table: dict, speeds: dict) -> list[dict]:
    """One row per scheme: quality, bytes (exact) and decode speed against the full model at each thread
    count; a scheme timed but not scored (the reference kernel: the same numbers) shows its speed only."""
    full_total = table["full"][1]["total"]
    labels = list(table) + [label for label in next(iter(speeds.values())) if label not in table]
    rows = []
    for label in labels:
        row = {"scheme": label}
        if label.startswith("llama.cpp"):
            row.update(dict.fromkeys(("perplexity", "KL", "top-1", "quantized bytes", "of fp32", "model bytes",
                                      "of full"), "-"))
        elif label in table:
            q, nbytes = table[label]
            quantized = nbytes["quantized"]
            row.update({"perplexity": f"{q.perplexity:.3f}", "KL": f"{q.kl:.2e}", "top-1": f"{q.top1:.2%}",
                        "quantized bytes": f"{quantized:,}" if quantized else "-",
                        "of fp32": f"{quantized / nbytes['quantized_fp32']:.3f}x" if quantized else "-",
                        "model bytes": f"{nbytes['total']:,}", "of full": f"{nbytes['total'] / full_total:.3f}x"})
        else:
            row.update(dict.fromkeys(("perplexity", "KL", "top-1", "quantized bytes", "of fp32", "model bytes",
                                      "of full"), "="))
        for t, by_label in speeds.items():
            rates, tokens = by_label.get(label, ([], []))
            full_rates, full_tokens = by_label["full"]
            same = next((i for i, (a, b) in enumerate(zip(tokens, full_tokens)) if a != b), len(tokens))
            row[f"tok/s {t}T"] = statistics.median(rates) if rates else "-"
            ratio = statistics.median(r / f for r, f in zip(rates, full_rates)) if rates else None
            row[f"vs full {t}T"] = f"{ratio:.2f}x" if rates else "-"
            row.setdefault("greedy = full", f"{same}/{len(tokens)}" if rates else "-")
        rows.append(row)
    return rows


def growing_rows(study: Search) -> list[dict]:
    """Each order's growing sets, and whether adding the next layer lowered the KL (paired z)."""
    rows = []
    for name, order in study.orders.items():
        previous = None
        for n in range(1, len(order) + 1):
            units = frozenset(order[:n])
            q = study.results[units]
            change = "-"
            if previous is not None:
                delta, _, z = paired_difference(previous.kl_per_window, q.kl_per_window)
                change = f"lower, z={z:.1f}" if delta > 0 else "higher"
            rows.append({"order": name if n == 1 else "", "added": order[n - 1], "layers": layers_label(units),
                         **shown(q), "vs previous set": change})
            previous = q
    return rows


def report(model: str, s: Settings, notes: list[str], kernels: list[dict], table: dict, speeds: dict, studies: list,
           conditions: dict, json_path: str | None, seconds: float) -> dict:
    print(f"{machine_line(conditions)}\nmodel: {model}; held-out text: {s.windows} windows x {s.window_tokens} "
          f"tokens = {s.windows * s.window_tokens:,} tokens scored per measurement")
    for note in notes:
        print(f"note: {note}")
    print_table(kernel_choice.table_rows(kernels),
                f"kernels: microseconds per call at the model's shapes (each matrix once per decoder layer, swept as "
                f"a decode step does; median of {s.kernel_repeats} sweeps, {torch.get_num_threads()} thread(s)); "
                f"aten bf16 rounds x to bfloat16")
    rows = scheme_rows(table, speeds)
    print_table(rows, f"schemes: quality on the held-out windows, weight bytes (exact), greedy decode at batch 1 "
                      f"({s.prompt_tokens}-token prompt, {s.new_tokens} new tokens, median of {s.repeats} "
                      f"interleaved runs at each torch thread count T; vs full = median of paired ratios)")
    print("every decoder layer's projections are quantized, and the LM head too in +head; the embedding stays full "
          "precision; "
          "minmax: int4 levels over each group's min..max (a float zero point); awq: activation-aware scaling; "
          "reference: dequantize-then-matmul instead of the fused kernel (same quality, '=')")
    pairs = anchor_ratios(speeds)
    if pairs:
        print_table(pairs, "minillm beside llama.cpp on the same weights, greedy decode at batch 1 (paired runs)")
    print("greedy = full: output tokens before the first that differs from the full model's (a near-tie between "
          "two tokens can flip the first one and send the rest down another path)")
    records = []
    for alone, study in studies:
        label = study.base.label()
        singles = [{"unit": f"layer {i}", **shown(study.results[frozenset({i})])}
                   for i in range(len(study.orders["most sensitive first"]))]
        print_table(singles + [{"unit": f"{p} (all layers)", **shown(q)} for p, q in alone.items()],
                    f"{label}: each layer alone (all its projections), each projection type alone (every layer)")
        print_table(growing_rows(study), f"{label}: growing sets of layers, in several orders")
        record = study.summary()
        top = record["cancellations"][:8]
        print(f"\n{label}: cancellation search over {record['sets_measured']} measured sets of layers"
              f"{' (every subset)' if study.exhaustive else ''}, {record['pairs']} nested pairs (S a strict subset "
              f"of T): T's mean KL lower in {record['superset_lower']}, beyond the noise (paired z >= "
              f"{record['z']:g}) in {record['beyond_z']}, beyond the Bonferroni threshold for {record['pairs']} pairs "
              f"(z >= {record['bonferroni_z']:.2f}) in {record['beyond_bonferroni']}")
        if top:
            print_table([{"S": layers_label(c["subset"]), "T": layers_label(c["superset"]),
                          "KL S": f"{c['kl_subset']:.2e}", "KL T": f"{c['kl_superset']:.2e}",
                          "drop": f"{c['delta']:.1e}", "± se": f"{c['stderr']:.1e}", "z": f"{c['z']:.1f}",
                          "perplexity S -> T": f"{c['perplexity_subset']:.3f} -> {c['perplexity_superset']:.3f}",
                          "NLL z": f"{c['nll_z']:.1f}"} for c in top],
                        f"{label}: the strongest cancellations (quantizing T lowers the KL of S)")
        print(f"{label}, perplexity: the same paired test on each window's mean NLL, the full model included as "
              f"the empty set ({record['nll_pairs']} pairs): T's perplexity lower in {record['nll_lower']}, beyond "
              f"the noise (z >= {record['z']:g}) in {record['nll_beyond_z']}, beyond the Bonferroni threshold "
              f"(z >= {record['nll_bonferroni_z']:.2f}) in {record['nll_beyond_bonferroni']}")
        if record["nll_drops"]:
            print_table([{"S": layers_label(c["subset"]) if c["subset"] else "{} (full)",
                          "T": layers_label(c["superset"]), "perplexity S -> T":
                          f"{c['perplexity_subset']:.3f} -> {c['perplexity_superset']:.3f}",
                          "NLL drop": f"{c['delta_nll']:.1e}", "± se": f"{c['stderr']:.1e}", "z": f"{c['z']:.1f}"}
                         for c in record["nll_drops"][:5]], f"{label}: the largest perplexity drops (by z)")
        records.append({**record, "layers_alone": {i: study.results[frozenset({i})].as_dict()
                                                   for i in range(len(singles))},
                        "projections_alone": {p: q.as_dict() for p, q in alone.items()},
                        "orders": study.orders,
                        "sets": [{"layers": sorted(k), **v.as_dict()} for k, v in study.results.items()]})
    print()
    for r in records:
        verdict = ("beyond the noise, even at the Bonferroni threshold" if r["beyond_bonferroni"] else
                   f"only at z >= {r['z']:g}, not at the Bonferroni threshold (as chance alone could give)"
                   if r["beyond_z"] else "none beyond the noise")
        nll = ("beyond the noise, even at the Bonferroni threshold" if r["nll_beyond_bonferroni"] else
               f"only at z >= {r['z']:g}, not at the Bonferroni threshold" if r["nll_beyond_z"] else
               "none beyond the noise")
        print(f"cancellation at {r['scheme']}: in KL from the full model {verdict}; in perplexity {nll}")
    measurements = len(table) + sum(len(a) + len(st.results) for a, st in studies)
    print(f"{measurements} quality measurements of {s.windows * s.window_tokens:,} tokens each; "
          f"the run took {seconds / 60:.1f} min")
    figures = {"model": model, "settings": dataclasses.asdict(s), "notes": notes, "kernels": kernels,
               "tokens_scored": s.windows * s.window_tokens, "schemes": rows,
               "bytes": {label: b for label, (_, b) in table.items()},
               "quality": {label: q.as_dict() for label, (q, _) in table.items()},
               "decode_tokens_per_s": {t: {label: r for label, (r, _) in by.items()} for t, by in speeds.items()},
               "llama_cpp": pairs, "sensitivity": records, "measurements": measurements, "seconds": seconds}
    write_json(json_path, "quant", figures, conditions)
    return figures
