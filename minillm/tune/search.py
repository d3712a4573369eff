"""tune(): the model ranks every configuration, successive halving runs the best, the runs check the model.

    result = tune("tiny", "chat", slo={"ttft": 1.0}, space={"max_num_seqs": [2, 8]}, results="t.json")
    result["recommendation"]["knobs"]   # the configuration measured best

The objective: "goodput" (requests/s meeting every SLO), "throughput" (output tokens/s: an offline job),
or "cost" ($ per 1M output tokens at price_per_hour: the tokens/s of requests meeting the SLO, the lower
the cost the better). The pieces lab 10 plugs in are keyword arguments: goodput_fn, front_fn, round_fn,
fits_fn, cost_fn.
"""
import dataclasses
import statistics

import torch
from tqdm import tqdm

from minillm.config import EngineConfig
from minillm.llm import LLM
from minillm.sim.calibrate import alone_seconds
from minillm.sim.step_profile import StepProfile
from minillm.tune.figures import run_figures
from minillm.tune.halving import halving_round, rungs
from minillm.tune.measurement import profile_of, real_run
from minillm.tune.memory_fit import fits, memory_needed, weight_bytes
from minillm.tune.objective import cost_per_million, goodput_objective, pareto_front
from minillm.tune.prediction import predict
from minillm.tune.record import Results
from minillm.tune.report import MB, error, print_table, recommendation_lines, run_row
from minillm.tune.space import DEFAULT_SPACE, configurations, engine_knobs, key
from minillm.tune.traffic import first_requests, named_workload

OBJECTIVES = {"goodput": "goodput", "throughput": "throughput", "cost": "good_tokens_s"}  # -> the figure maximized


class TuneError(ValueError):
    """A search that cannot answer: the message says why, with the values, and what would."""


def tune(model: str = "smollm2-135m-instruct", workload: str = "chat", objective: str = "goodput",
         slo: dict[str, float] | None = None, space: dict[str, list] | None = None, requests: int = 64,
         rate: float | None = None, load: float = 2.0, memory_budget: int | None = None, threads: int | None = None,
         price_per_hour: float | None = None, results: str = "tune.json", top: int = 4, seed: int = 0,
         quick: bool = True, profiles: dict[str, StepProfile] | None = None,
         goodput_fn=goodput_objective, front_fn=pareto_front, round_fn=halving_round,
         fits_fn=fits, cost_fn=cost_per_million, out=print, progress: bool = True) -> dict:
    """Search `space` for the configuration that serves `workload` best; -> the results file's content.
    rate: the chat workload's requests/s (None: `load` times what one request at a time would serve).
    profiles: step profiles already measured, by quantization scheme (the others are measured here)."""
    if objective not in OBJECTIVES:
        raise TuneError(f"unknown objective {objective!r}: the objectives are {', '.join(OBJECTIVES)}")
    if objective == "cost" and not price_per_hour:
        raise TuneError("the cost objective needs --price-per-hour (the machine's price in $ an hour)")
    if not first_requests(workload, requests, 1.0, seed):  # a bad trace line or workload name: before any work
        raise TuneError(f"the workload {workload!r} holds no request")
    slo = dict(slo or {}) if objective != "throughput" else {}
    space = space or DEFAULT_SPACE
    score = OBJECTIVES[objective]
    if threads:
        torch.set_num_threads(threads)
    inputs = {"model": model, "workload": workload, "objective": objective, "slo": slo, "requests": requests,
              "rate": rate, "load": load, "seed": seed, "space": {k: [str(v) for v in vs] for k, vs in space.items()},
              "memory_budget": memory_budget, "threads": threads or torch.get_num_threads()}
    record = Results(results, inputs)
    base = LLM(model)
    candidates = within_budget(accepted(configurations(space), model, out), base, memory_budget, fits_fn)
    bar = tqdm(total=len({c["quantization"] for c in candidates}) + len(candidates), desc="tune: the model",
               unit="step", disable=not progress, leave=False)
    try:
        given, profiles = dict(profiles or {}), {}
        for scheme in dict.fromkeys(c["quantization"] for c in candidates):
            bar.set_description(f"tune: the step profile of {scheme}")
            profiles[scheme] = given.get(scheme) or StepProfile(**record.cached("profiles", scheme, measured_profile,
                                                                         base, scheme, quick))
            bar.update()
        if rate is None and workload == "chat":
            rate = load / alone_seconds(next(iter(profiles.values())))
        plan = rungs(min(top, len(candidates)), requests)  # (candidates, requests each) of each round of real runs
        arrivals = {n: first_requests(workload, n, rate or 1.0, seed) for _, n in plan}
        predicted_at = (lambda knobs, n: record.cached("predicted", f"{key(knobs)} @{n}", predict, arrivals[n],
                                                       profiles[knobs["quantization"]], knobs, slo, goodput_fn))
        predicted = []
        for knobs in candidates:
            bar.set_description(f"tune: the model of {key(knobs)}")
            predicted.append(predicted_at(knobs, requests)[score])
            bar.update()
        bar.close()
        ranked = [candidates[i] for i in sorted(range(len(candidates)), key=lambda i: -predicted[i])]  # ties: order
        measured_at = (lambda knobs, n: record.cached("measured", f"{key(knobs)} @{n}", measure, base, knobs,
                                                      arrivals[n], slo, goodput_fn, seed))
        runs, every = halving(ranked[:top], plan, score, predicted_at, measured_at, round_fn, progress)
    except KeyboardInterrupt:
        bar.close()
        record.save()
        out(f"\ninterrupted: {record.count('measured')} real runs and {record.count('predicted')} predictions are "
            f"saved in {record.path}; run the same command again (same --results) to resume without repeating them")
        raise
    rows = [run_row(key(knobs), n, score, predicted, measured) for knobs, n, predicted, measured in every]
    print_table(rows, f"the configurations really run ({workload}, {objective}"
                      f"{', SLO ' + ', '.join(f'{k} <= {v:g} s' for k, v in slo.items()) if slo else ''}): "
                      f"the model beside the measurement, and its error", out)
    print_errors(runs, score, out)
    points = [{"configuration": k, score: m[score], "ttft_p99": m["ttft_p99"],
               "memory_mb": memory_needed(base.engine.model_config, knobs)["total"] / MB} for k, (knobs, _, _, m)
              in runs.items()]
    print_table(front_fn(points, score, ("ttft_p99", "memory_mb")),
                f"the Pareto front: {score} against p99 TTFT and memory (the measured runs)", out)
    winner, _, _, measured = runs[next(reversed(runs))]
    if measured[score] <= 0:
        closest = min(runs.values(), key=lambda r: max(r[3]["ttft_p99"] / slo.get("ttft", float("inf")),
                                                      r[3]["tpot_p99"] / slo.get("tpot", float("inf"))))
        raise TuneError(f"no configuration meets the SLO {slo}: the closest measured, {key(closest[0])}, has p99 "
                        f"TTFT {closest[3]['ttft_p99']:.3g} s and p99 TPOT {closest[3]['tpot_p99']:.3g} s; loosen the "
                        f"SLO or lower the load (--rate)")
    for line in recommendation_lines(model, winner, score, measured):
        out(line)
    record.data["recommendation"] = {"knobs": winner, "measured": measured, "key": key(winner)}
    if price_per_hour:
        record.data["cost"] = cost_of_waiting(base, winner, measured, requests, slo, goodput_fn, price_per_hour, seed,
                                              cost_fn, record, out)
    record.save()
    return record.data


def accepted(candidates: list[dict], model: str, out=print) -> list[dict]:
    """The candidates EngineConfig accepts; each one it refuses is printed with its reason, and skipped."""
    kept = []
    for knobs in candidates:
        try:
            EngineConfig.from_knobs(model, **engine_knobs(knobs))
            kept.append(knobs)
        except (ValueError, TypeError) as e:
            out(f"skipped {key(knobs)}: {e}")
    if not kept:
        raise TuneError(f"the engine accepts no configuration of the space ({len(candidates)} refused, above)")
    return kept


def within_budget(candidates: list[dict], base: LLM, budget: int | None, fits_fn) -> list[dict]:
    """The candidates whose weights + KV + activations fit the budget; a TuneError when none does."""
    if budget is None:
        return candidates
    shape = base.engine.model_config
    kept = [c for c in candidates if fits_fn(shape, c, budget)[0]]
    if kept:
        return kept
    lightest = min(candidates, key=lambda c: memory_needed(shape, c)["total"])
    weights = weight_bytes(shape, lightest["quantization"])
    if weights > budget:
        raise TuneError(f"the memory budget of {budget / MB:.1f} MB is smaller than the weights alone: "
                        f"{lightest['quantization']} weights need {weights / MB:.1f} MB; quantize them (int8, int4) "
                        f"or raise --memory-budget")
    need = memory_needed(shape, lightest)["total"]
    raise TuneError(f"no configuration fits {budget / MB:.1f} MB: the lightest, {key(lightest)}, needs "
                    f"{need / MB:.1f} MB ({(need - budget) / MB:.1f} MB over); shrink num_kv_blocks or "
                    f"max_num_batched_tokens in the space")


def halving(candidates: list[dict], plan: list[tuple[int, int]], score: str, model, run, round_fn,
            progress: bool) -> dict:
    """Successive halving over the candidates, best predicted first: each round runs its survivors on its
    number of requests (run(knobs, n) -> measured figures) and keeps the next round's count by round_fn.
    -> ({key: (knobs, requests, predicted, measured)} of each configuration's longest run, the winner last;
    every run in the order run)."""
    runs, every, survivors = {}, [], candidates
    with tqdm(total=sum(c for c, _ in plan), desc="tune: real runs", unit="run", disable=not progress,
              leave=False) as bar:
        for i, (count, n) in enumerate(plan):
            scores = []
            for knobs in survivors[:count]:
                bar.set_description(f"tune: {key(knobs)} on {n} requests")
                measured = run(knobs, n)
                runs.pop(key(knobs), None)
                runs[key(knobs)] = (knobs, n, model(knobs, n), measured)
                every.append(runs[key(knobs)])
                scores.append((key(knobs), measured[score]))
                bar.update()
            best, _ = round_fn(scores, plan[i + 1][0] if i + 1 < len(plan) else 1)
            survivors = [next(k for k in survivors if key(k) == name) for name in best]
    winner = key(survivors[0])
    runs[winner] = runs.pop(winner)
    return runs, every


def measured_profile(base: LLM, scheme: str, quick: bool) -> dict:
    return dataclasses.asdict(profile_of(base, scheme, quick))


def measure(base: LLM, knobs: dict, requests, slo, goodput_fn, seed: int) -> dict:
    served, growth = real_run(base, knobs, requests, seed)
    return {**run_figures(served, slo, goodput_fn), "rss_growth": growth}


def print_errors(runs: dict, score: str, out=print) -> None:
    """The model's mean absolute error over the real runs, and the factor that corrects its score: the median
    of measured over predicted (what the model's figure for a configuration not run should be scaled by)."""
    ttft = [abs(error(p["ttft_p99"], m["ttft_p99"])) for _, _, p, m in runs.values()]
    tpot = [abs(error(p["tpot_p99"], m["tpot_p99"])) for _, _, p, m in runs.values()]
    ratios = [m[score] / p[score] if p[score] else float("nan") for _, _, p, m in runs.values()]
    out(f"the simulator's error on the configurations really run (their longest run): TTFT p99 "
        f"{statistics.mean(ttft):.0%}, TPOT p99 {statistics.mean(tpot):.0%} on average (aim: <= 15%); "
        f"the measured {score} was {statistics.median(ratios):.2f}x the model's (median): the factor that corrects it")


def cost_of_waiting(base, knobs, measured, requests, slo, goodput_fn, price, seed, cost_fn, record, out) -> dict:
    """$ per 1M output tokens serving interactively at the SLO (the tuned run's good tokens/s) against an
    offline batch job on the same configuration (every request at once: its full throughput)."""
    batch = record.cached("measured", f"batch: {key(knobs)} @{requests}", lambda: measure(
        base, knobs, named_workload("batch", requests, 1.0, seed), {}, goodput_fn, seed))
    interactive = cost_fn(price, measured["good_tokens_s"]) if measured["good_tokens_s"] > 0 else None
    offline = cost_fn(price, batch["throughput"])
    saving = 1 - offline / interactive if interactive else None
    out(f"cost per 1M output tokens at ${price:g}/hour: interactive at the SLO ${interactive:.3g} "
        f"({measured['good_tokens_s']:.0f} good tokens/s), offline batch ${offline:.3g} ({batch['throughput']:.0f} "
        f"tokens/s): batch saves {saving:.0%}" if interactive else f"offline batch: ${offline:.3g} per 1M tokens")
    return {"interactive_usd_per_1m": interactive, "batch_usd_per_1m": offline, "saving": saving}
