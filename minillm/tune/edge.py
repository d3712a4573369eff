"""The edge question: which quantization, KV pool and context length fit a memory budget at a TPOT, and
with what quality?

One sequence at a time (an edge device serves its one user): a candidate is a scheme and a context length,
its KV pool just holding that context. Its memory is memory_fit's (weights + KV + activations); its TPOT the
scheme's measured step profile's price of a decode at the full context (the slowest token of the answer);
its quality the perplexity and KL against the full-precision model on held-out text (experiments/
quant_quality.py, what `bench quant` measures). The answer is the best quality that fits, at its longest
context; when nothing fits, the closest candidate and by how much it misses.
"""
import dataclasses

from minillm.arith import cdiv
from minillm.experiments.quant_quality import Reference, heldout_windows
from minillm.llm import LLM
from minillm.quant import QuantConfig
from minillm.sim.step_profile import StepProfile
from minillm.tune.measurement import profile_of
from minillm.tune.memory_fit import memory_needed, weight_bytes
from minillm.tune.record import Results
from minillm.tune.report import MB, print_table

CONTEXTS = (512, 1024, 2048, 4096, 8192)
EDGE_SCHEMES = ("none", "int8", "int4")
PREFILL_CHUNK = 256  # the edge engine's token budget a step: a long prompt is chunked, its activations stay small


class EdgeError(ValueError):
    """No candidate fits the budgets: the message names the closest and by how much it misses."""


def edge_knobs(scheme: str, context: int, block_size: int = 16) -> dict:
    """The configuration of one sequence of `context` tokens under a scheme (space.py's knobs)."""
    return {"quantization": scheme, "max_num_seqs": 1, "max_num_batched_tokens": min(context, PREFILL_CHUNK),
            "block_size": block_size, "num_kv_blocks": cdiv(context, block_size), "enable_prefix_caching": False,
            "enable_chunked_prefill": True, "max_model_len": context}


def quality_of(base: LLM, scheme: str, windows: int = 8, tokens: int = 128) -> dict:
    """Perplexity and KL (nats a token) of the scheme against the full-precision weights on held-out text."""
    reference = Reference(base.model, heldout_windows(base.engine.model_dir, windows, tokens))
    if scheme == "none":
        q = reference.quality
    else:
        q = reference.compare(LLM(base.config.model, weights=base.model, quantization=QuantConfig(scheme)).model)
    return {"perplexity": q.perplexity, "kl": q.kl, "top1": q.top1}


def edge(model: str, memory_budget: int, tpot_budget: float, schemes=EDGE_SCHEMES, contexts=CONTEXTS,
         results: str = "tune-edge.json", profiles: dict[str, StepProfile] | None = None, out=print) -> dict:
    """The candidates' memory, TPOT and quality, and the answer {"knobs", "memory", "tpot", ...}; an
    EdgeError when nothing fits (the budget smaller than every scheme's weights, or no context at the speed)."""
    base = LLM(model)
    shape = base.engine.model_config
    contexts = [c for c in contexts if c <= shape.max_position_embeddings] or [shape.max_position_embeddings]
    record = Results(results, {"mode": "edge", "model": model, "schemes": list(schemes), "contexts": contexts})
    lightest = min(weight_bytes(shape, s) for s in schemes)
    if lightest > memory_budget:
        raise EdgeError(f"the memory budget of {memory_budget / MB:.1f} MB is smaller than the weights alone: the "
                        f"lightest scheme's need {lightest / MB:.1f} MB ("
                        + ", ".join(f"{s}: {weight_bytes(shape, s) / MB:.1f} MB" for s in schemes) + ")")
    rows = []
    for scheme in schemes:
        profile = (profiles or {}).get(scheme) or StepProfile(**record.cached(
            "profiles", scheme, lambda s: dataclasses.asdict(profile_of(base, s)), scheme))
        quality = record.cached("quality", scheme, quality_of, base, scheme)
        for context in contexts:
            memory = memory_needed(shape, edge_knobs(scheme, context))["total"]
            tpot = profile.step_time(0, 1, context)
            rows.append({"scheme": scheme, "context": context, "memory MB": memory / MB, "TPOT ms": 1e3 * tpot,
                         "perplexity": quality["perplexity"], "KL": quality["kl"],
                         "fits": memory <= memory_budget and tpot <= tpot_budget, "_miss": max(
                             memory / memory_budget, tpot / tpot_budget)})
    print_table([{k: v for k, v in r.items() if not k.startswith("_")} for r in rows],
                f"{model} under {memory_budget / MB:.0f} MB and TPOT {1e3 * tpot_budget:.0f} ms: one sequence", out)
    fitting = [r for r in rows if r["fits"]]
    if not fitting:
        closest = min(rows, key=lambda r: r["_miss"])
        record.data["answer"] = None
        record.save()
        raise EdgeError(f"nothing fits: the closest, {closest['scheme']} at {closest['context']} context, needs "
                        f"{closest['memory MB']:.1f} MB (the budget is {memory_budget / MB:.1f} MB) and decodes at "
                        f"{closest['TPOT ms']:.1f} ms a token (the budget is {1e3 * tpot_budget:.1f} ms): it misses by "
                        f"{closest['_miss'] - 1:.0%}")
    best = min(fitting, key=lambda r: (r["KL"], -r["context"]))
    knobs = edge_knobs(best["scheme"], best["context"])
    answer = {"knobs": knobs, **{k: v for k, v in best.items() if not k.startswith("_")}}
    out(f"fits: {best['scheme']} at {best['context']} context, {best['memory MB']:.1f} MB of "
        f"{memory_budget / MB:.1f}, TPOT {best['TPOT ms']:.1f} ms of {1e3 * tpot_budget:.1f}, perplexity "
        f"{best['perplexity']:.3g} (KL {best['KL']:.3g} nats a token against fp32)")
    record.data["answer"] = answer
    record.save()
    return answer

