"""Scaling out, measured and simulated: real processes on this machine, the simulator checked against
the real engine, and fleets no laptop runs.

1. Validation: the step profile is measured on the real engine (a calibration workload of its own),
   then other workloads run for real (one replica, and two in processes of their own) and in the
   simulator; the errors of throughput and of TTFT and TPOT p50 / p99 are reported (the aim: within 15%).
2. Routing on a real fleet: replicas as server processes behind the cache-aware router, a
   multi-tenant multi-turn workload; each policy's prefix hit rate, TTFT and throughput.
3. At fleet scale (simulated): agent sessions of many tenants, bursty arrivals, replicas of a real
   model on a real GPU (roofline profile): routing policies, prefill:decode ratios, autoscaling.
4. Colocated vs disaggregated prefill/decode (two real worker processes): TTFT, ITL, bytes moved.
5. Tensor parallelism (gloo, real processes): bytes all-reduced per token measured and by formula.
6. A capacity plan: the fewest replicas meeting a TTFT / TPOT SLO for 99% of requests.
"""
import statistics
from functools import partial

from minillm.bench import SMALLER_QUICK, is_big, print_table, progress, write_json
from minillm.bench.conditions import check_conditions, machine_line
from minillm.config import EngineConfig
from minillm.engine.engine import LLMEngine
from minillm.experiments.disagg_comparison import measure_disaggregation
from minillm.experiments.routing_trial import measure_routing
from minillm.experiments.tp_communication import measure_tp_communication
from minillm.perf import PROFILES, kv_bytes_per_token, model_shape
from minillm.sim import StepProfile, simulate
from minillm.sim.autoscale import Autoscaler, queue_rule
from minillm.sim.calibrate import (
    CALIBRATION_REQUESTS,
    alone_seconds,
    fit_profile,
    measure_profile,
    recorded_steps,
    replay,
    replica_knobs,
    steps_since_idle,
    workload,
)
from minillm.sim.fleet_replay import replay_fleet
from minillm.sim.plan import predict, replicas_needed, summary
from minillm.sim.workloads import agent_sessions
from minillm.testing import give_memory_back
from minillm.tp.tp_model import tp_sizes

FIGURES = [("output tok/s", "output_throughput", 1), ("TTFT p50 ms", "ttft_median", 1e3),  # (label, key, scale)
           ("TTFT p99 ms", "ttft_p99", 1e3), ("TPOT p50 ms", "tpot_median", 1e3), ("TPOT p99 ms", "tpot_p99", 1e3)]
FLEET_MODEL, FLEET_GPU = "Llama-3.1-8B", "H100 SXM"
SLO = {"ttft": 1.0, "tpot": 0.05}


LOADS = [("light", 0.4, 1), ("heavy", 1.5, 1), ("2 replicas", 1.5, 2)]  # (name, utilisation a replica, replicas)
REPEATS = {True: 1, False: 6}  # real runs of each load, quick or not (each after a calibration of its own): the
#   figures are their medians. This machine's speed moves by 20% and more between a calibration and its run; a
#   median of six such pairs landed within 14% where one of three missed by up to 23% (the same recordings).
#   A quick run is a smoke run: one pair a load, whose p99s of 24 requests are near their maxima
REQUESTS = {True: 24, False: 90}  # requests a replica in each real run, quick or not
QUICK_BIG = 8  # --quick on a big model: requests a replica in each real run, and in each calibration
# and only the heavy loads (the light one idles most of its wall time, minutes on a big model), two routers
QUICK_BIG_LOADS = LOADS[1:]
QUICK_BIG_ROUTERS = ("round_robin", "prefix_aware")
QUICK_BIG_DECODE = 96  # tokens a decoder makes in the disaggregation run: at SmolLM2's ~45 ms a step they outlast
# the long prompts' arrivals (the last at 0.9 s) and prefills all the same


def validate(engine: LLMEngine | None, model: str, knobs: dict, profile: StepProfile, quick: bool, bar,
             requests_each: int, calibration_requests: int, loads: list[tuple[str, float, int]]) -> list[dict]:
    """Real runs against simulated ones at a light and a heavy load on one replica, and the heavy load on
    each of two replicas in processes of their own behind round robin (rates from `profile`). This
    machine's speed drifts from minute to minute, so a full run repeats each real run, each right after a
    calibration of its own that its simulation uses (the first in-process run's is `profile`, which run()
    measured on `engine` just before); the error is the median simulated figure's against
    the median real one, beside the real runs' own spread. Each simulated figure is itself the median of
    a few seeded simulations (`predict`): a measured profile draws each step's time from the spread the
    calibration measured, at a pace that persists from step to step as the measured one did. Two checks
    split the error in its parts: the simulator on a profile fitted to the real run's own steps (its
    batching and queueing alone, the machine's drift taken out), and a row per load for the step model
    alone (each real step against its price, times its warmup factor if it ran soon after an idle pause).
    requests_each: requests a replica in each real run; calibration_requests: in each calibration; loads:
    (name, utilisation a replica, replicas) of each, from LOADS. engine: the in-process one, for the loads of one
    replica (None where every load is a fleet of processes: run() frees it first, so that its weights and pool do
    not sit beside theirs); knobs: its replica_knobs, which the simulated replicas share."""
    if not loads:
        return []
    alone = alone_seconds(profile)
    rows = []
    calibrated_just_before = engine is not None  # run() measured `profile` on this engine right before this call
    for seed, (name, utilisation, replicas) in enumerate(loads, start=10 + LOADS.index(loads[0])):
        requests = workload(requests_each * replicas, replicas * utilisation / alone, seed=seed)
        fleet = {"replicas": replicas, "router": "round_robin"}
        reals, sims, own_sims, step_errors = [], [], [], []
        for _ in range(REPEATS[quick]):
            if replicas == 1:
                if calibrated_just_before:
                    calibrated, calibrated_just_before = profile, False
                else:
                    calibrated = measure_profile(engine, requests=calibration_requests)
                real, steps, woke = recorded_steps(engine, partial(replay, engine, requests))
            else:
                calibration, (steps, woke), knobs, real = replay_fleet(model, requests, replicas, calibration_requests)
                calibrated = fit_profile(*calibration)
            reals.append(summary(real))
            sims.append(predict(requests, calibrated, **fleet, **knobs))
            own_sims.append(predict(requests, fit_profile(steps, woke), **fleet, **knobs))
            step_errors += [(calibrated.step_time(p, d, c) * calibrated.cold(k) - t) / t
                            for (p, d, c, t), k in zip(steps, steps_since_idle(woke))]
        rows += comparison_rows(name, reals, sims, own_sims, step_errors)
        bar.update()
    return rows


def comparison_rows(load: str, reals: list[dict], sims: list[dict], own_sims: list[dict],
                    step_errors: list[float]) -> list[dict]:
    """One row per figure (medians of the repeats), then the step model's median error."""
    rows = []
    for label, key, scale in FIGURES:
        values = sorted(r[key] * scale for r in reals)
        real = statistics.median(values)
        sim, own = (statistics.median(r[key] * scale for r in runs) for runs in (sims, own_sims))
        rows.append({"load": load, "figure": label, "real": real,
                     "real runs spread": f"{(values[-1] - values[0]) / real:.0%}" if len(values) > 1 else "-",
                     "simulated": sim,
                     "error": f"{(sim - real) / real:+.1%}", "on the run's own steps": own,
                     "its error": f"{(own - real) / real:+.1%}"})
    rows.append({"load": load, "figure": f"a step's time ({len(step_errors)} steps)", "real": "-",
                 "real runs spread": "-", "simulated": "-", "error": f"{statistics.median(step_errors):+.1%} median, "
                 f"±{statistics.median(abs(e) for e in step_errors):.1%} apart", "on the run's own steps": "-",
                 "its error": "-"})
    return rows


def routing(profile: StepProfile, replicas: int, sessions: int, bar) -> list[dict]:
    rows = []
    for router in ("round_robin", "least_loaded", "prefix_aware"):
        bar.set_description(f"cluster: {router}")
        work = agent_sessions(sessions, rate=sessions / 60, seed=0)
        result = simulate([], profile, replicas=replicas, router=router, sessions=work, kv_blocks=20_000)
        s = summary(result.requests, SLO)
        rows.append({"router": router, "calls": s["completed"], "prefix hits": f"{s['prefix_hit_rate']:.1%}",
                     "TTFT p50 s": s["ttft_median"], "TTFT p99 s": s["ttft_p99"],
                     "TPOT p50 ms": s["tpot_median"] * 1e3, "output tok/s": s["output_throughput"],
                     "goodput req/s": s["goodput"]})
        bar.update()
    return rows


KV_LINK = 50e9  # bytes/s between a prefill and a decode replica (400 Gb/s RDMA); Llama-3.1-8B: 128 KiB of K/V a token


def disaggregated_ratios(profile: StepProfile, model_config, quick: bool, bar) -> list[dict]:
    """The same 8 replicas split prefill:decode 0:8 (colocated), 2:6, 4:4, 6:2, under agent sessions."""
    rate, seconds = (16.0, 15) if quick else (32.0, 30)
    per_token = kv_bytes_per_token(model_config, "bfloat16") / KV_LINK
    rows = []
    for prefill in (0, 2, 4, 6):
        work = agent_sessions(int(rate * seconds), rate=rate, seed=2)
        result = simulate([], profile, replicas=8 - prefill, prefill_replicas=prefill, router="prefix_aware",
                          sessions=work, kv_blocks=20_000, transfer_seconds_per_token=per_token)
        s = summary(result.requests, SLO)
        rows.append({"prefill:decode": f"{prefill}:{8 - prefill}" if prefill else "colocated (8)",
                     "TTFT p50 s": s["ttft_median"], "TTFT p99 s": s["ttft_p99"], "TPOT p50 ms": s["tpot_median"] * 1e3,
                     "TPOT p99 ms": s["tpot_p99"] * 1e3, "in SLO": f"{s['slo_attainment']:.1%}",
                     "prefix hits": f"{s['prefix_hit_rate']:.1%}", "output tok/s": s["output_throughput"]})
        bar.update()
    return rows


def autoscaling(profile: StepProfile, quick: bool, bar) -> list[dict]:
    """Bursty sessions: a fixed fleet sized for the bursts, a smaller fixed one, and a queue-driven autoscaler."""
    sessions = 150 if quick else 300
    variants = [("fixed 8 replicas", {"replicas": 8}), ("fixed 3 replicas", {"replicas": 3}),
                ("autoscaled (queue rule, 30 s startup)", {"replicas": 2, "autoscaler": Autoscaler(
                    rule=queue_rule(per_replica=24), interval=5.0, startup_seconds=30.0, max_replicas=16)})]
    rows = []
    for name, options in variants:
        work = agent_sessions(sessions, rate=3.0, seed=3, burstiness=0.2)
        result = simulate([], profile, router="prefix_aware", sessions=work, kv_blocks=20_000, **options)
        s = summary(result.requests, SLO)
        rows.append({"fleet": name, "replica-hours": result.replica_seconds / 3600,
                     "in SLO": f"{s['slo_attainment']:.1%}", "TTFT p99 s": s["ttft_p99"],
                     "TPOT p99 ms": s["tpot_p99"] * 1e3, "largest fleet": len(result.replicas)})
        bar.update()
    return rows


def tensor_parallel(model: str, model_config, quick: bool) -> dict:
    """TP on gloo against TP=1, at the smallest size > 1 that splits the model (2, or 3 for SmolLM2's 9 heads):
    the all-reduce traffic per token measured and by formula, its time, tokens/s."""
    size = next(n for n in tp_sizes(model_config) + [2] if n > 1)  # [2]: a model TP cannot split refuses by name
    tp = measure_tp_communication(model, tp=size, tokens=(8 if is_big(model) else 16) if quick else 64)
    rows = [{"figure": "bytes all-reduced per token", "measured": tp["bytes_per_token_measured"],
             "formula": tp["bytes_per_token_formula"]},
            {"figure": "ring bytes sent per rank per token", "measured": "-",
             "formula": tp["ring_bytes_per_rank_per_token"]},
            {"figure": "all-reduce ms per step", "measured": tp["allreduce_seconds_per_step"] * 1e3, "formula": "-"},
            {"figure": f"output tokens/s, TP=1 -> TP={size}", "measured": f"{tp['tokens_per_s_tp1']:.1f} -> "
                                                                         f"{tp[f'tokens_per_s_tp{size}']:.1f}",
             "formula": "-"}]
    title = (f"{model}, {size} ranks, {tp['allreduce_calls']} all-reduces over {tp['steps']} steps; greedy tokens "
             f"equal to TP=1: {tp['greedy_tokens_equal']} (2 x layers x hidden x 4 bytes per token; on one 2-core CPU "
             f"the ranks share the cores, so TP cannot be faster here)")
    return {"rows": rows, "title": title, **tp}


def run(quick: bool = False, json_path: str | None = None, model: str | None = None) -> dict:
    model = model or "tiny"
    conditions = check_conditions()
    fleet_profile = StepProfile.from_roofline(model_shape(FLEET_MODEL), PROFILES[FLEET_GPU])
    replicas, sessions = (8, 60) if quick else (64, 600)
    big = quick and is_big(model)
    requests_each = QUICK_BIG if big else REQUESTS[quick]
    calibration = QUICK_BIG if big else CALIBRATION_REQUESTS[quick]
    with progress("cluster", len(LOADS) + 3 + 4 + 4 + 3, unit="part") as bar:
        bar.set_description("cluster: calibrating on the real engine")
        engine = LLMEngine(EngineConfig.from_knobs(model, max_num_seqs=16, enable_prefix_caching=False))
        profile = measure_profile(engine, requests=calibration)
        bar.set_description("cluster: real vs simulated")
        loads, knobs = QUICK_BIG_LOADS if big else LOADS, replica_knobs(engine)
        checks = validate(engine, model, knobs, profile, quick, bar, requests_each, calibration,
                          [load for load in loads if load[2] == 1])
        model_config = engine.model_config
        # The in-process runs are over: the engine's weights, their packed copy for batched products and its KV
        # pool would sit beside every process below (on SmolLM2, 1.5 GB more at the peak: the suite's peak was the
        # two replicas' run beside it). Engines hold reference cycles, so the collector frees them now, and glibc
        # hands the freed heap back (a matrix under 32 MB is heap, not its own mapping).
        del engine
        give_memory_back()
        checks += validate(None, model, knobs, profile, quick, bar, requests_each, calibration,
                           [load for load in loads if load[2] > 1])
        bar.set_description("cluster: routing on a real fleet")
        real_routes = measure_routing(replicas=2, quick=quick, model=model,
                                      **({"policies": QUICK_BIG_ROUTERS} if big else {}))
        bar.update()
        routes = routing(fleet_profile, replicas, sessions, bar)
        bar.set_description("cluster: prefill:decode ratios")
        ratios = disaggregated_ratios(fleet_profile, model_shape(FLEET_MODEL), quick, bar)
        bar.set_description("cluster: autoscaling")
        scaling = autoscaling(fleet_profile, quick, bar)
        bar.set_description("cluster: colocated vs disaggregated")
        disagg = measure_disaggregation(model, quick=quick, decode_tokens=QUICK_BIG_DECODE if big else None)
        bar.update()
        bar.set_description("cluster: tensor parallelism")
        tp = tensor_parallel(model, model_config, quick)
        bar.update()
        bar.set_description("cluster: capacity plan")
        slo = SLO
        rate = 2.0 if quick else 10.0
        needed, plan = replicas_needed(lambda: ([], agent_sessions(int(rate * 60), rate=rate, seed=1)),
                                       fleet_profile, slo, kv_blocks=20_000, router="prefix_aware")
        bar.update()
    print(machine_line(conditions))
    if big:
        print(f"--quick: {SMALLER_QUICK}: {requests_each} requests a replica in each real run and in each "
              f"calibration, the loads {', '.join(name for name, _, _ in QUICK_BIG_LOADS)} only, routers "
              f"{', '.join(QUICK_BIG_ROUTERS)}, {QUICK_BIG_DECODE} tokens a decoder in the disaggregation run, "
              f"8 tokens for "
              f"tensor parallelism")
    print(f"\nstep profile of {model} measured here ({profile.source}): {profile.describe()}")
    runs = f"the median of {REPEATS[quick]} runs" if REPEATS[quick] > 1 else "one run"
    print_table(checks, f"1. the simulator against real runs of the same workload (one replica, then two in "
                        f"processes of their own behind round robin; real: {runs} of {requests_each} requests "
                        f"a replica)")
    figures_checked = [r for r in checks if r["real"] != "-"]
    worst = max(abs(r["simulated"] - r["real"]) / r["real"] for r in figures_checked)
    worst_own = max(abs(r["on the run's own steps"] - r["real"]) / r["real"] for r in figures_checked)
    smoke = "; a quick run is a smoke run, its p99s of few requests near their maxima" if quick else ""
    print(f"largest error: {worst:.1%} calibrated before each run, {worst_own:.1%} on each run's own steps "
          f"(aim: within 15%{smoke})")
    print_table([{"router": name, "prefix hits": f"{f['prefix_hit_rate']:.1%}",
                  "router's estimate": f"{f['router_hit_estimate']:.1%}", "TTFT p50 ms": f["ttft_p50_s"] * 1e3,
                  "TTFT p99 ms": f["ttft_p99_s"] * 1e3, "output tok/s": f["output_tok_s"],
                  "completed": f["completed"], "failed": f["failed"]} for name, f in real_routes["policies"].items()],
                f"2. routing on a real fleet: {real_routes['replicas']} replica processes behind the router, "
                f"{real_routes['workload']}")
    print_table(routes, f"3. routing {sessions} agent sessions (1-50 calls, 16 tenants, bursty) over {replicas} "
                        f"replicas of {FLEET_MODEL} on {FLEET_GPU} (simulated; {fleet_profile.source})")
    print_table(ratios, f"3b. the same 8 replicas split between prefill and decode (simulated, agent sessions; K/V "
                        f"over a {KV_LINK / 1e9:.0f} GB/s link): decode no longer waits behind prefills, until too "
                        f"few prefill replicas queue the prompts")
    print_table(scaling, "3c. bursty agent sessions (gamma gaps, shape 0.2): fixed fleets against an autoscaler "
                         "(simulated)")
    print_table([{"variant": name, **disagg[name]} for name in ("colocated", "disaggregated")],
                f"4. colocated vs disaggregated prefill/decode ({disagg['threads']})")
    print("KV bytes moved per request (prompt tokens: bytes): " +
          ", ".join(f"{n}: {b:,}" for n, b in sorted(disagg["kv_bytes_per_request"].items())))
    print_table(tp["rows"], f"5. tensor parallelism on gloo: {tp['title']}")
    print(f"\n6. capacity plan: {rate:g} agent sessions/s of {FLEET_MODEL} on {FLEET_GPU} need {needed} replicas "
          f"to meet TTFT <= {slo['ttft']} s and TPOT <= {slo['tpot'] * 1e3:.0f} ms for 99% of calls (simulated: "
          f"attainment {plan['slo_attainment']:.1%}, TTFT p99 {plan['ttft_p99']:.2f} s)")
    figures = {"model": model, "smaller_quick_workload": big, "profile": vars(profile), "validation": checks,
               "validation_worst_error": worst,
               "validation_worst_error_own_steps": worst_own,
               "disaggregated_ratios": ratios, "autoscaling": scaling, "routing_real": real_routes,
               "disaggregation": disagg, "tensor_parallel": tp, "routing": routes,
               "replicas": replicas, "sessions": sessions,
               "capacity_plan": {"sessions_per_s": rate, "slo": slo, "replicas": needed,
                                 "attainment": plan["slo_attainment"]}}
    write_json(json_path, "cluster", figures, conditions)
    return figures
