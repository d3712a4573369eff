"""Speculative decoding: what each proposer buys at each k, against the theory, and where it loses.

Two workloads of held-out Python (stdlib files the bundled models never trained on), and one of chat:
  * code: slices of a module's source starting at a def or class line, for the model to continue;
  * edit: a function, a comment asking for it renamed, and the renamed def line: a faithful
    output repeats the function's body, which is in the prompt for a proposer to copy;
  * chat (a model with a chat template of its own, an instruct model): held-out questions in the
    template, answered until the model ends its turn (training/chat_prompts.py).
Batch 1 (one request at a time, as in the decode benchmark) is the main case. Every variant, no
speculation and each proposer at each k, decodes the same prompts with the same engine settings;
the variants take turns prompt by prompt, in rotating order, so drifting machine speed hits all
alike. Decode tokens/s = tokens after the first / the time after the first (1 / TPOT), summed over
the prompts; a speedup is the median over repetitions of that repetition's ratio. The engine's own
counts give the acceptance rate alpha and tokens per verifying forward, beside the theory line
(1 - alpha^(k+1)) / (1 - alpha). Greedy, and temperature 1 at one k. Then many requests at once:
output tokens/s of the whole batch (prefill included), with and without speculation.
"""
import dataclasses
import itertools
import json
import math
import statistics
import time

from minillm import LLM, SamplingParams
from minillm.bench import SMALLER_QUICK, is_big, print_table, progress, write_json
from minillm.bench.conditions import check_conditions, machine_line
from minillm.bench.spec_workloads import chat_prompts, code_prompts, copied, edit_prompts, heldout_sources
from minillm.config import SpeculativeConfig
from minillm.models.registry import bundled_models, resolve_model_path
from minillm.speculative.draft import check_same_vocabulary, quantized_self_draft
from minillm.speculative.heads import HEADS_FILE
from minillm.speculative.mlp_speculator import find_speculator
from minillm.speculative.speculator import SpecStats
from minillm.speculative.theory import expected_tokens_per_forward
from minillm.tokenizer import Tokenizer

WORKLOADS = ("code", "edit", "chat")
# issue 12: the best proposer on edits; heads or distilled draft on code. Issue 32: a model-based proposer
# on chat, on the real model
TARGETS = {"edit": 1.5, "code": 1.2, "chat": 1.3}
# Self-speculation on a big model: its own weights quantized, drafting for the float32 model (a weight-streaming
# model's quantized forward costs a fraction of its float32 one)
SELF_DRAFT = ("draft self-int4-g32-minmax, int8 head", {"method": "draft", **quantized_self_draft()})
MODEL_BASED = ("heads", "draft pico-distilled", SELF_DRAFT[0], "mlp")  # the proposers the code and chat targets are for
COUNTS = ("proposed", "reached", "accepted", "verifications", "emitted")


@dataclasses.dataclass(frozen=True)
class Settings:
    prompts: int          # prompts per workload at batch 1
    new_tokens: int       # output tokens per request (EOS ignored)
    repeats: int
    ks: tuple[int, ...]
    sampled_k: int        # the k also measured at temperature 1
    batch: int            # requests at once in the large-batch case
    batch_ks: tuple[int, ...]
    code_tokens: int = 192           # code prompt length
    edit_body: tuple[int, int] = (100, 170)  # tokens of an edited function


FULL = Settings(prompts=8, new_tokens=128, repeats=3, ks=(1, 2, 4, 8), sampled_k=4, batch=16, batch_ks=(2, 4))
QUICK = Settings(prompts=3, new_tokens=40, repeats=1, ks=(1, 4), sampled_k=4, batch=8, batch_ks=(4,))
QUICK_BIG = Settings(prompts=2, new_tokens=24, repeats=1, ks=(1, 4), sampled_k=4, batch=4, batch_ks=(4,),
                     code_tokens=128)
# a real model's full run: every decode step streams all its weights, so fewer prompts, ks and tokens; k = 6 for a
# draft that agrees nearly always (the self draft), where the theory line keeps rising past 4
FULL_BIG = Settings(prompts=4, new_tokens=48, repeats=2, ks=(1, 4, 6), sampled_k=4, batch=4, batch_ks=(4,))


def draft_misfit(draft: str, target: Tokenizer, target_vocab: int) -> str | None:
    """Why `draft` cannot propose for this target (another tokenizer), or None: checked before any
    engine loads, so a big target is not loaded only to refuse its draft."""
    path = resolve_model_path(draft)
    draft_vocab = json.loads((path / "config.json").read_text())["vocab_size"]
    try:
        check_same_vocabulary(Tokenizer(path), target, draft_vocab, target_vocab, draft)
    except ValueError as e:
        return str(e)
    return None


def proposers(model: str) -> tuple[list[tuple[str, dict]], list[str]]:
    """(label, SpeculativeConfig fields) of each proposer available for this target, and a note on
    each one skipped. Prompt lookup (ngram) fits every target; a draft only one with its tokenizer."""
    path = resolve_model_path(model)
    target = Tokenizer(path)
    target_vocab = json.loads((path / "config.json").read_text())["vocab_size"]
    found, notes = [("ngram", {"method": "ngram"})], []
    for draft in ("pico", "pico-distilled"):
        if draft not in bundled_models():
            notes.append(f"draft {draft} skipped: minillm/assets/models/{draft} does not exist"
                         + (" (`python -m minillm train distill`)" if draft == "pico-distilled" else ""))
        elif why := draft_misfit(draft, target, target_vocab):
            notes.append(f"draft {draft} skipped: {why}")
        else:
            found.append((f"draft {draft}", {"method": "draft", "draft_model": draft}))
    if not any(label.startswith("draft") for label, _ in found):
        notes.append(f"no bundled draft shares {model}'s tokenizer, so no other model drafts here; the proposers "
                     f"that fit it: {', '.join(label for label, _ in found)}")
    if is_big(path):
        found.append(SELF_DRAFT)
    if (path / HEADS_FILE).is_file():
        found.append(("heads", {"method": "heads"}))
    else:
        notes.append(f"heads skipped: {model} has no {HEADS_FILE} (`python -m minillm train heads --model {model}`)")
    if (file := find_speculator(path)) is not None:
        found.append(("mlp", {"method": "mlp", "speculator": str(file)}))
    else:
        notes.append(f"mlp skipped: no MLP speculator for {model} beside it or bundled (`python -m minillm train "
                     f"speculator --model {model}`)")
    return found, notes


def spec_counts(llm: LLM) -> dict[str, int]:
    stats = llm.engine.speculator.stats if llm.engine.speculator else SpecStats()
    return {c: getattr(stats, c) for c in COUNTS}


def since(llm: LLM, before: dict[str, int]) -> SpecStats:
    """The engine's speculation counts since `before` (a spec_counts snapshot)."""
    return SpecStats(**{c: n - before[c] for c, n in spec_counts(llm).items()})


def one_at_a_time(llms: dict[str, LLM], prompts: list[list[int]], params: list[SamplingParams], repeats: int,
                  bar, label: str) -> dict[str, dict]:
    """Batch 1: each prompt through every variant in turn. -> per variant: decode tokens/s of each
    repetition, the first repetition's outputs, and the speculation counts of all of them."""
    names, before = list(llms), {name: spec_counts(llm) for name, llm in llms.items()}
    tokens, seconds = ({name: [0.0] * repeats for name in names} for _ in range(2))
    outputs = {name: [] for name in names}
    for turn, (rep, i) in enumerate(itertools.product(range(repeats), range(len(prompts)))):
        for name in names[turn % len(names):] + names[:turn % len(names)]:
            bar.set_description(f"spec: {label}, {name}, prompt {i + 1}/{len(prompts)}, run {rep + 1}/{repeats}")
            out = llms[name].generate([prompts[i]], params[i], use_tqdm=False)[0].outputs[0]
            n = len(out.token_ids) - 1
            tokens[name][rep] += n
            seconds[name][rep] += out.metrics["tpot"] * n
            if rep == 0:
                outputs[name].append(out.token_ids)
            bar.update()
    return {name: {"rates": [t / s for t, s in zip(tokens[name], seconds[name])], "outputs": outputs[name],
                   "stats": since(llms[name], before[name])} for name in names}


def all_at_once(llms: dict[str, LLM], prompts: list[list[int]], params: SamplingParams, repeats: int,
                bar, label: str) -> dict[str, dict]:
    """Every prompt submitted at once: output tokens / wall seconds of the whole batch, per repetition."""
    names, before = list(llms), {name: spec_counts(llm) for name, llm in llms.items()}
    rates, outputs = {name: [] for name in names}, {}
    for rep in range(repeats):
        for name in names[rep % len(names):] + names[:rep % len(names)]:
            bar.set_description(f"spec: {label}, {name}, run {rep + 1}/{repeats}")
            start = time.perf_counter()
            outs = llms[name].generate(prompts, params, use_tqdm=False)
            rates[name].append(sum(len(o.token_ids) for o in outs) / (time.perf_counter() - start))
            outputs[name] = [o.token_ids for o in outs]
            bar.update()
    return {name: {"rates": rates[name], "outputs": outputs[name], "stats": since(llms[name], before[name])}
            for name in names}


def rows(results: dict[str, dict], variants: dict[str, tuple[str, int]], greedy: bool, **where) -> list[dict]:
    """One row per speculating variant against "none" (no speculation), measured in the same runs."""
    base, out = results["none"], []
    for name, (proposer, k) in variants.items():
        r, stats = results[name], results[name]["stats"]
        alpha = stats.acceptance_rate
        out.append({**where, "proposer": proposer, "k": k, "tokens_per_s": statistics.median(r["rates"]),
                    "base_tokens_per_s": statistics.median(base["rates"]),
                    "speedup": statistics.median(a / b for a, b in zip(r["rates"], base["rates"])),
                    "alpha": alpha, "tokens_per_forward": stats.tokens_per_forward,
                    "theory": expected_tokens_per_forward(alpha, k), "proposed": stats.proposed,
                    "same_tokens": r["outputs"] == base["outputs"] if greedy else None})
    return out


def shown(row: dict, base: bool = False) -> dict:
    """A row as printed; base: with the tokens/s without speculation measured beside it."""
    same = {} if row["same_tokens"] is None else {"same tokens": "yes" if row["same_tokens"] else "NO"}
    return {"proposer": row["proposer"], "k": row["k"], **({"none tok/s": row["base_tokens_per_s"]} if base else {}),
            "tok/s": row["tokens_per_s"], "speedup": f"{row['speedup']:.2f}x", "alpha": f"{row['alpha']:.2f}",
            "tok/forward": row["tokens_per_forward"], "theory": row["theory"], **same}


def run(quick: bool = False, json_path: str | None = None, model: str | None = None) -> dict:
    model = model or "tiny"
    conditions = check_conditions()
    big = is_big(model)
    s = (QUICK_BIG if quick else FULL_BIG) if big else QUICK if quick else FULL
    found, notes = proposers(model)
    if big:
        notes.insert(0, f"{'--quick: ' + SMALLER_QUICK if quick else 'a big model'}: {s.prompts} prompts of "
                        f"{s.new_tokens} new tokens, k={s.ks}, {s.batch} requests at once")
    if model not in bundled_models():
        notes.append(f"held out from the bundled models' training only: {model} was trained elsewhere, likely on "
                     f"public code that includes these stdlib files")
    path = resolve_model_path(model)
    tokenizer, sources = Tokenizer(path), heldout_sources()
    edits = edit_prompts(tokenizer, sources, s.batch, s.edit_body)
    prompts = {"code": code_prompts(tokenizer, sources, s.batch, s.code_tokens), "edit": [p for p, _ in edits],
               "chat": chat_prompts(path, s.batch)}
    workloads = [w for w in WORKLOADS if prompts[w]]
    if "chat" not in workloads:
        notes.append(f"chat skipped: {model} has no chat template of its own (not an instruct model)")
    longest = max(len(p) for w in workloads for p in prompts[w]) + s.new_tokens + max(s.ks) + 1
    settings = dict(enable_prefix_caching=False, max_num_seqs=s.batch,
                    num_kv_blocks=s.batch * math.ceil(longest / 16) + s.batch, block_size=16)
    llms, variants = {"none": LLM(model, **settings)}, {}
    weights = llms["none"].model  # one copy of the target's weights for every variant
    for (label, fields), k in itertools.product(found, s.ks):
        try:
            llms[f"{label}, k={k}"] = LLM(model, weights, speculative=SpeculativeConfig(k=k, **fields), **settings)
            variants[f"{label}, k={k}"] = (label, k)
        except ValueError as e:  # a draft with another vocabulary, heads that predict fewer than k tokens ahead
            notes.append(f"{label}, k={k} skipped: {e}")
    sampled, batched = subsets(variants, s)
    warm = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    for llm in llms.values():
        llm.generate([prompts["code"][0]], warm, use_tqdm=False)
    calls = len(workloads) * s.repeats * (s.prompts * (len(llms) + len(sampled) + 1) + len(batched) + 1)
    results = {}
    with progress("spec", calls) as bar:
        for w in workloads:
            to_the_end = w != "chat"  # a chat answer ends with its turn; code and edits run on for new_tokens
            greedy = [SamplingParams(max_tokens=s.new_tokens, temperature=0, ignore_eos=to_the_end)] * s.prompts
            seeded = [SamplingParams(max_tokens=s.new_tokens, temperature=1.0, seed=i, ignore_eos=to_the_end)
                      for i in range(s.prompts)]
            some = {n: llms[n] for n in ["none", *sampled]}
            results[w, 0.0] = one_at_a_time(llms, prompts[w][:s.prompts], greedy, s.repeats, bar, f"{w}, greedy")
            results[w, 1.0] = one_at_a_time(some, prompts[w][:s.prompts], seeded, s.repeats, bar, f"{w}, temperature 1")
            results[w, "batch"] = all_at_once({n: llms[n] for n in ["none", *batched]}, prompts[w], greedy[0],
                                              s.repeats, bar, f"{w}, {s.batch} at once")
    return report(results, workloads, variants, [want for _, want in edits], model, s, notes, conditions, json_path)


def subsets(variants: dict[str, tuple[str, int]], s: Settings) -> tuple[dict, dict]:
    """The variants also measured at temperature 1, and those also measured with many requests at once."""
    return ({n: v for n, v in variants.items() if v[1] == s.sampled_k},
            {n: v for n, v in variants.items() if v[1] in s.batch_ks})


def report(results: dict, workloads: list[str], variants: dict[str, tuple[str, int]], faithful: list[list[int]],
           model: str, s: Settings, notes: list[str], conditions: dict, json_path: str | None) -> dict:
    sampled, batched = subsets(variants, s)
    batch1 = {w: rows(results[w, 0.0], variants, True, workload=w, temperature=0.0) for w in workloads}
    hot = {w: rows(results[w, 1.0], sampled, False, workload=w, temperature=1.0) for w in workloads}
    big = {w: rows(results[w, "batch"], batched, True, workload=w, batch=s.batch) for w in workloads}
    share = copied(results["edit", 0.0]["none"]["outputs"], [want[:s.new_tokens] for want in faithful])
    chat = " and chat" if "chat" in workloads else ""
    print(f"{machine_line(conditions)}\nmodel: {model}; held-out stdlib Python{chat}; {s.prompts} prompts per "
          f"workload at batch 1, {s.new_tokens} new tokens each, median of {s.repeats} interleaved run(s)")
    for note in notes:
        print(f"note: {note}")
    for w in workloads:
        none = statistics.median(results[w, 0.0]["none"]["rates"])
        print_table([{"proposer": "none", "k": "-", "tok/s": none, "speedup": "1.00x", "alpha": "-",
                      "tok/forward": 1.0, "theory": "-", "same tokens": "-"}] + [shown(r) for r in batch1[w]],
                    f"{w} prompts, batch 1, greedy: decode tokens/s with and without speculation")
        print_table([shown(r, base=True) for r in hot[w]],
                    f"{w} prompts, batch 1, temperature 1 (seeded), k={s.sampled_k}")
    print(f"\nedit workload: without speculation, the target's greedy output repeats the function faithfully "
          f"for a median {share:.0%} of its tokens before departing from it")
    for w in workloads:
        print_table([shown(r, base=True) for r in big[w]],
                    f"{w} prompts, {s.batch} requests at once, greedy: output tokens/s of the batch (prefill "
                    f"included)")
    every = [r for w in workloads for r in batch1[w] + hot[w] + big[w]]
    loses = [r for r in every if r["speedup"] < 1]
    if loses:
        print_table([{"case": f"{r['workload']}, " + (f"batch {r['batch']}" if "batch" in r else
                                                       f"batch 1, temperature {r['temperature']:g}"),
                      **{key: v for key, v in shown(r).items() if key != "same tokens"}}
                     for r in sorted(loses, key=lambda r: r["speedup"])],
                    "where speculation loses: every configuration above slower than no speculation")
    else:
        print("\nno configuration measured here was slower than no speculation")
    best = {w: max(batch1[w], key=lambda r: r["speedup"]) for w in workloads if batch1[w]}
    strong = {w: [r for r in batch1[w] if r["proposer"] in MODEL_BASED] for w in workloads if w != "edit"}
    measured = {"edit": best.get("edit"), **{w: max(rs, key=lambda r: r["speedup"]) if rs else None
                                             for w, rs in strong.items()}}
    targets = {w: {"target": TARGETS[w], "measured": None if r is None else r["speedup"],
                   "by": None if r is None else f"{r['proposer']}, k={r['k']}",
                   "met": r is not None and r["speedup"] >= TARGETS[w]} for w, r in measured.items()}
    print()
    for w, r in best.items():
        print(f"best at batch 1 on {w}: {r['speedup']:.2f}x with {r['proposer']}, k={r['k']} (alpha {r['alpha']:.2f})")
    for w in targets:
        t, what = targets[w], ("the best proposer on the edit workload" if w == "edit" else
                               f"a model-based proposer ({', '.join(MODEL_BASED)}) on {w} prompts, batch 1")
        got = ("not measured (none ships for this model)" if t["measured"] is None
               else f"{t['measured']:.2f}x ({t['by']})")
        print(f"target >= {t['target']}x, {what}: {got}: {'met' if t['met'] else 'NOT met'}")
    figures = {"model": model, "settings": dataclasses.asdict(s), "notes": notes,
               "batch1_greedy": batch1, "batch1_temperature_1": hot, f"batch_{s.batch}": big,
               "edit_faithful_share_without_speculation": share, "loses": loses,
               "best_batch1": best, "targets": targets}
    write_json(json_path, "spec", figures, conditions)
    return figures
