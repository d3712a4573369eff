"""Speculative decoding for the page: short runs of the engine with a proposer, recorded step by step.

Plain functions over an engine factory (the page passes shared.engines.build_engine, which shares
the target's loaded weights between runs), so they are tested without a page. The engine is read
through its public surface only: the StepEvents it publishes (each carries the step's verifications),
the chunks step() returns, and the speculator's stats.
"""
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from minillm import EngineConfig, SamplingParams
from minillm.arith import cdiv
from minillm.config import Components, SpeculativeConfig
from minillm.engine.engine import LLMEngine
from minillm.models.model_config import ModelConfig
from minillm.models.registry import resolve_model_path
from minillm.speculative.draft import check_same_vocabulary, quantized_self_draft
from minillm.speculative.heads import HEADS_FILE
from minillm.speculative.speculator import SpecStats
from minillm.speculative.theory import expected_tokens_per_forward
from minillm.step import StepEvent, Verification
from minillm.tokenizer import Tokenizer
from minillm_visualizer.shared.sizing import is_real, sequence_bound

_FUNCTION = '''def count_words(text):
    """Count how often each word occurs in text."""
    counts = {}
    for word in text.split():
        word = word.lower()
        counts[word] = counts.get(word, 0) + 1
    return counts
'''
# Code to continue, and an edit whose faithful answer repeats the function's body (prompt lookup's best case).
PROMPTS = {
    "fibonacci": "def fibonacci(n):",
    "stack": "class Stack:\n    def __init__(self):\n",
    "imports": "import os\nimport sys\n",
    "edit: rename a function": (_FUNCTION + "\n\n# count_words, renamed to word_counts; the body does not change.\n"
                                "def word_counts(text):\n"),
}
PROPOSERS = {"ngram": "prompt lookup (n-gram)", "draft": "draft model", "heads": "prediction heads (MTP)"}
SELF_DRAFT = "self: its own weights in int4, int8 head"  # the target's own weights as its draft (speculative/draft.py)
SWEEP_KS = [1, 2, 3, 4, 6, 8]
TRAIN_HEADS = "python -m minillm train heads"
BLOCK_SIZE = 16


@dataclass
class Segment:
    """What one step added to one sample. With proposals verified: the ones the target kept, the first
    it refused (None if it kept all), the ones after that it never reached, and its own token after
    them (a correction or the bonus). Without: `own` is the token(s) the target sampled itself."""
    step: int
    accepted: list[int] = field(default_factory=list)
    rejected: int | None = None
    unreached: list[int] = field(default_factory=list)
    own: list[int] = field(default_factory=list)
    verified: bool = False


@dataclass
class SpecRun:
    """One run of the engine over some prompts: what each step did to each, and the counts."""
    method: str | None            # the proposer, or None: no speculation
    k: int
    prompts: dict[str, str]       # request id -> prompt
    segments: dict[str, list[Segment]] = field(default_factory=dict)
    pieces: dict[int, str] = field(default_factory=dict)  # token id -> its text
    steps: int = 0                # target forwards
    output_tokens: int = 0
    seconds: float = 0.0          # stepping the engine (building it excluded)
    stats: SpecStats = field(default_factory=SpecStats)

    @property
    def tokens_per_second(self) -> float:
        return self.output_tokens / self.seconds if self.seconds else 0.0


def label(method: str | None, draft: str | None = None) -> str:
    if method is None:
        return "none (no speculation)"
    return f"{PROPOSERS[method]} ({draft})" if method == "draft" and draft else PROPOSERS[method]


def heads_path(model: str) -> Path:
    return resolve_model_path(model) / HEADS_FILE


@functools.lru_cache(maxsize=8)
def _vocabulary(model: str) -> tuple[Tokenizer, int]:
    path = resolve_model_path(model)
    return Tokenizer(path), ModelConfig.from_file(path / "config.json").vocab_size


def drafts_for(target: str, models: list[str]) -> list[str]:
    """The models that can draft for `target`: the others with its tokenizer (a draft's token ids must mean
    what the target's do; draft.check_same_vocabulary is the engine's own test)."""
    target_tokenizer, target_vocab = _vocabulary(target)
    out = []
    for name in models:
        if name == target:
            continue
        tokenizer, vocab = _vocabulary(name)
        try:
            check_same_vocabulary(tokenizer, target_tokenizer, vocab, target_vocab, name)
        except ValueError:
            continue
        out.append(name)
    return out


def draft_choices(target: str, models: list[str]) -> list[str]:
    """The drafts the page offers for `target`: the other models with its tokenizer, then its own weights quantized."""
    return [*drafts_for(target, models), SELF_DRAFT]


def draft_fields(draft: str | None) -> dict:
    """SpeculativeConfig's fields for a draft choice."""
    return quantized_self_draft() if draft == SELF_DRAFT else {"draft_model": draft}


def proposer_problem(method: str, model: str, draft: str | None) -> str | None:
    """Why `method` cannot propose for `model` on this machine, in words; None if it can."""
    if method == "heads" and not heads_path(model).is_file():
        # the command first has the target continue 512 prompts, the text the heads learn from
        when = "much longer for a real model, which writes their training text" if is_real(model) else "minutes"
        return (f"No prediction heads have been trained for {model} yet (there is no {heads_path(model).name} "
                f"beside its weights). Train them ({when} on a CPU) with `{TRAIN_HEADS} --model {model}`, "
                f"then run again.")
    if method == "draft" and not draft:
        return (f"No other model here shares {model}'s tokenizer, so none can draft for it: a draft's token ids "
                f"must mean what the target's do.")
    return None


def chosen_prompts(names: list[str], own: str) -> dict[str, str]:
    """Request id (the prompt's name) -> prompt: the chosen built-in prompts, then the learner's own."""
    prompts = {n: PROMPTS[n] for n in names}
    if own.strip():
        prompts["your prompt"] = own
    if not prompts:
        raise ValueError("no prompt is chosen: pick one of the prompts or write your own")
    return prompts


def engine_config(model: str, method: str | None, k: int, draft: str | None, num_prompts: int,
                  components: Components | None = None, tokens_per_prompt: int | None = None) -> EngineConfig:
    """The target with speculation by `method` (None: without), and `components` (the learner's parts)
    if given; a pool with room for every prompt's `tokens_per_prompt` (None: its full context), so a run
    never preempts."""
    spec = None
    if method is not None:
        problem = proposer_problem(method, model, draft)
        if problem:
            raise ValueError(problem)
        where = {"draft": draft_fields(draft), "heads": {"heads": str(heads_path(model))}}.get(method, {})
        spec = SpeculativeConfig(method, k=k, **where)
    context = ModelConfig.from_file(resolve_model_path(model) / "config.json").max_position_embeddings
    tokens = min(context, tokens_per_prompt or context)
    return EngineConfig.from_knobs(model, speculative=spec, block_size=BLOCK_SIZE,
                             num_kv_blocks=num_prompts * (cdiv(tokens, BLOCK_SIZE) + 1),
                             components=components or Components())


def tokens_needed(prompts: dict[str, str], max_tokens: int, k: int) -> int:
    """An upper bound on one sequence's length: the longest prompt with its output, and k proposals in flight
    (with room for the bonus token)."""
    return max(sequence_bound(p, max_tokens) for p in prompts.values()) + k + 1


def run_prompts(make_engine: Callable[[EngineConfig], LLMEngine], config: EngineConfig, prompts: dict[str, str],
                max_tokens: int, temperature: float, seed: int = 0,
                on_step: Callable[[SpecRun], None] | None = None) -> SpecRun:
    """Run every prompt at once through a fresh engine, to the end; on_step(run) after each step."""
    engine = make_engine(config)
    spec = config.speculative
    run = SpecRun(spec and spec.method, spec.k if spec else 0, dict(prompts), {rid: [] for rid in prompts})
    if engine.speculator is not None:
        run.stats = engine.speculator.stats  # the engine's own counts, growing as it steps
    for i, (rid, prompt) in enumerate(prompts.items()):
        engine.add_request(prompt, SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed + i,
                                                  ignore_eos=True), request_id=rid)
    events: list[StepEvent] = []
    engine.subscribe(events.append)
    while engine.has_unfinished():
        start = time.perf_counter()
        chunks = engine.step()
        run.seconds += time.perf_counter() - start  # the engine's time only, not the page's drawing
        if events:
            run.steps += 1
            _record(run, events.pop().verifications, chunks, engine.tokenizer.decode)
        if on_step is not None:
            on_step(run)
    engine.unsubscribe(events.append)
    return run


def _record(run: SpecRun, verifications: list[Verification], chunks, decode) -> None:
    by_request = {(v.request_id, v.index): v for v in verifications}
    for chunk in chunks:
        tokens = list(chunk.token_ids)  # fewer than verified when a stop ended the sample early
        run.output_tokens += len(tokens)
        v = by_request.get((chunk.request_id, chunk.index))
        if v is None:
            segment = Segment(run.steps, own=tokens)
        else:
            m = min(v.accepted, len(tokens))
            segment = Segment(run.steps, accepted=tokens[:m], own=tokens[m:m + 1], verified=True,
                              rejected=v.proposed[v.accepted] if v.accepted < len(v.proposed) else None,
                              unreached=list(v.proposed[v.accepted + 1:]))
        run.segments[chunk.request_id].append(segment)
        shown = [*segment.accepted, *segment.own, *segment.unreached]
        if segment.rejected is not None:
            shown.append(segment.rejected)
        for t in shown:
            if t not in run.pieces:
                run.pieces[t] = decode([t], skip_special_tokens=False)


def sweep(make_engine, model: str, method: str, draft: str | None, ks: list[int], prompts: dict[str, str],
          max_tokens: int, temperature: float) -> tuple[list[dict], list[str]]:
    """The same prompts at each k. -> a row per k (measured acceptance and tokens per forward, and the
    theory at that k's acceptance), and a message for each k the proposer refused."""
    rows, skipped = [], []
    for k in sorted(set(ks)):
        try:
            config = engine_config(model, method, k, draft, len(prompts),
                                   tokens_per_prompt=tokens_needed(prompts, max_tokens, k))
            run = run_prompts(make_engine, config, prompts, max_tokens, temperature)
        except ValueError as exc:
            skipped.append(f"k = {k}: {exc}")
            continue
        s = run.stats
        rows.append({"k": k, "acceptance rate": s.acceptance_rate, "tokens per forward": s.tokens_per_forward,
                     "theory at this alpha": expected_tokens_per_forward(s.acceptance_rate, k),
                     "proposed": s.proposed, "reached": s.reached, "accepted": s.accepted,
                     "verifications": s.verifications, "target forwards": run.steps,
                     "tokens/s": run.tokens_per_second})
    return rows, skipped


def pooled_alpha(rows: list[dict]) -> float:
    """The acceptance rate over every k of a sweep: accepted / reached, summed."""
    reached = sum(r["reached"] for r in rows)
    return sum(r["accepted"] for r in rows) / reached if reached else 0.0


def compare(make_engine, model: str, variants: list[tuple[str, str | None]], k: int, prompts: dict[str, str],
            max_tokens: int, temperature: float) -> list[dict]:
    """Each (proposer, draft model) on the same prompts, beside the engine without speculation (the first row)."""
    SpeculativeConfig("ngram", k=k)  # a k no proposer takes is refused once, with the engine's own message
    warm = {"warm": "def"}
    run_prompts(make_engine, engine_config(model, None, k, None, 1, tokens_per_prompt=tokens_needed(warm, 4, k)),
                warm, 4, 0.0)  # first-run costs
    rows = []
    for method, draft in [(None, None), *variants]:
        name = label(method, draft)
        problem = method and proposer_problem(method, model, draft)
        if problem:
            rows.append({"proposer": name, "note": problem})
            continue
        try:
            config = engine_config(model, method, k, draft, len(prompts),
                                   tokens_per_prompt=tokens_needed(prompts, max_tokens, k))
            run = run_prompts(make_engine, config, prompts, max_tokens, temperature)
        except ValueError as exc:
            rows.append({"proposer": name, "note": str(exc)})
            continue
        rows.append({"proposer": name, "acceptance rate": run.stats.acceptance_rate if method else None,
                     "tokens per forward": run.stats.tokens_per_forward, "target forwards": run.steps,
                     "tokens/s": run.tokens_per_second, "note": ""})
    base = rows[0].get("tokens/s")
    for row in rows:
        row["speedup"] = row["tokens/s"] / base if base and row.get("tokens/s") else None
    return rows
