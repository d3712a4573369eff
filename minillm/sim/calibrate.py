"""Calibrating the simulator on the real engine, and checking it against real runs.

    profile = measure_profile(engine)                        # fit StepProfile to the engine's own steps
    real = replay(engine, requests)                          # the workload through the real engine
    sim = simulate(copies(requests), profile, **replica_knobs(engine))

`replay` drives a real LLMEngine in wall-clock time: each request is added when its arrival time has
passed, and its timings are counted from that nominal arrival (a request that arrives during a step
waits for it, as it would in a server). `measure_profile` replays a calibration workload of its own,
with varied prompt lengths and loads, and fits the step costs to every step the engine reports.
"""
import dataclasses
import random
import statistics
import time
from collections.abc import Callable

from minillm.engine.engine import LLMEngine
from minillm.sampling import SamplingParams
from minillm.sequence import Phase
from minillm.sim.replica import SimRequest, copies
from minillm.sim.step_profile import WARMUP_BINS, StepProfile
from minillm.step import StepEvent

Step = tuple[int, int, int, float]  # (prefill tokens, decode seqs, context tokens, seconds) of one engine step
STEP_PHASES = ("schedule", "prepare", "model", "sample", "update")  # LLMEngine.step's timed work
CALIBRATION_REQUESTS = {True: 24, False: 48}  # a calibration's burst and trickle, quick or not (+ half as many lone)
TRICKLE_START = 0.5  # seconds into a calibration when its trickle starts (the burst has arrived at 0)
LONE_RATE = 8.0  # lone prompts a second in a calibration: one costs ~30-60 ms here, so most find the engine idle
IDLE = 2e-3  # seconds between one step's end and the next one's start from which the engine was idle


def workload(n: int, rate: float, seed: int, prompt: tuple[int, int] = (16, 200),
             output: tuple[int, int] = (8, 64)) -> list[SimRequest]:
    """n requests with Poisson arrivals at `rate`/s and prompt and output lengths uniform in the ranges."""
    rng, t, out = random.Random(seed), 0.0, []
    for i in range(n):
        t += rng.expovariate(rate) if rate != float("inf") else 0.0
        out.append(SimRequest(t, rng.randint(*prompt), rng.randint(*output), request_id=str(i)))
    return out


def alone_seconds(profile: StepProfile) -> float:
    """What workload()'s mean request (108 prompt tokens, 36 output tokens, decodes reading ~140 tokens of
    context) costs a replica serving it by itself. A workload at rate u / alone_seconds keeps one replica
    busy u of the time if it served one request at a time: above 1, requests must batch and queue."""
    return profile.step_time(108, 0, 0) + 36 * profile.step_time(0, 1, 140)


def replica_knobs(engine: LLMEngine) -> dict:
    """The simulated replica's knobs equal to the engine's."""
    kv = engine.view.kv_stats()
    scheduler = engine.config.scheduler
    return {"max_num_seqs": scheduler.max_num_seqs, "max_num_batched_tokens": scheduler.max_num_batched_tokens,
            "kv_blocks": kv.total_blocks, "block_size": kv.block_size}


def replay(engine: LLMEngine, requests: list[SimRequest], seed: int = 0,
           start: float | None = None) -> list[SimRequest]:
    """Run requests through the real engine at their arrival times; -> copies with first_scheduled and
    token_times filled in, in seconds from the start (the simulator's clock). start: the time.perf_counter()
    that is 0 on that clock (None: now); the system's monotonic clock, the same in every process."""
    rng = random.Random(seed)
    vocab = engine.model_config.vocab_size
    pending = sorted(copies(requests), key=lambda r: r.arrival)
    live: dict[str, SimRequest] = {}
    start = time.perf_counter() if start is None else start
    queue = list(pending)
    while queue or engine.has_unfinished():
        now = time.perf_counter() - start
        while queue and queue[0].arrival <= now:
            r = queue.pop(0)
            prompt = [rng.randrange(1, vocab) for _ in range(r.prompt_tokens)]
            engine.add_request(prompt, SamplingParams(max_tokens=r.output_tokens, temperature=0, ignore_eos=True),
                               request_id=f"replay-{r.request_id}")
            live[f"replay-{r.request_id}"] = r
        if not engine.has_unfinished():
            time.sleep(max(queue[0].arrival - now, 0.0))
            continue
        for chunk in engine.step():
            r = live[chunk.request_id]
            r.token_times += [time.perf_counter() - start] * len(chunk.token_ids)
            if chunk.request is not None:
                queued = chunk.request.metrics["queue_time"] or 0.0
                r.first_scheduled = r.token_times[0] - chunk.request.metrics["ttft"] + queued
    return pending


def step_record(event: StepEvent, seconds: float) -> Step:
    """(prefill tokens, decode seqs, context tokens, seconds) of one engine step."""
    computed = {(s.request_id, s.index): s.num_computed_tokens for s in event.sequences}
    prefill = sum(w.num_tokens for w in event.scheduled if w.phase == Phase.PREFILL)
    decodes = [w for w in event.scheduled if w.phase == Phase.DECODE]
    context = sum(computed.get((w.request_id, w.index), 0) for w in decodes)
    return prefill, len(decodes), context, seconds


def step_seconds(events: list[StepEvent]) -> list[float]:
    """What each step cost the caller: from its start to the next step's start when the engine ran them
    back to back (so the loop's own time between steps counts, as it does in a server), else the step's
    timed work. The observer's telemetry, which a run without observers does not pay, is left out."""
    work = [sum(e.timings.get(p, 0.0) for p in STEP_PHASES) for e in events]
    out = []
    for i, e in enumerate(events):
        telemetry = e.timings.get("telemetry", 0.0)
        gap = events[i + 1].start - e.start - telemetry if i + 1 < len(events) else None
        out.append(gap if gap is not None and gap < work[i] + IDLE + telemetry else work[i])
    return out


def recorded_steps(engine: LLMEngine, run: Callable[[], object]) -> tuple[object, list[Step], list[bool]]:
    """Call run() with the engine's steps recorded. -> (what run returned, each step's (prefill tokens,
    decode seqs, context tokens, seconds), whether it followed an idle pause)."""
    events: list[StepEvent] = []
    engine.subscribe(events.append)
    try:
        result = run()
    finally:
        engine.unsubscribe(events.append)
    seconds = step_seconds(events)
    steps = [step_record(e, t) for e, t in zip(events, seconds)]
    woke = [i > 0 and events[i].start - events[i - 1].start - seconds[i - 1] > IDLE for i in range(len(events))]
    return result, steps, woke


def calibration_workload(requests: int = 48, seed: int = 1) -> list[SimRequest]:
    """What a calibration replays: a burst, a trickle and lone prompts, so the steps range from one decode
    to full prefill budgets. The burst and the trickle (`requests` in all) run the batched and mixed steps
    of a busy replica; the lone prompts (half as many again, short answers, most arriving to an idle engine)
    run what a lightly loaded replica does: prompts of every length by themselves, right after an idle
    pause, which the other two phases rarely do. Without them the prompt steps a light load runs were
    priced from a handful of steps, and a calibration's TTFT and TPOT were off by 18% a run on average
    (11% with them: six runs of each load, each calibrated before it)."""
    burst = workload(requests // 2, float("inf"), seed)
    trickle = workload(requests - requests // 2, 6.0, seed + 1)
    lone = workload(requests // 2, LONE_RATE, seed + 2, output=(2, 8))
    lone_start = TRICKLE_START + trickle[-1].arrival + 1.0
    return (burst + [dataclasses.replace(r, arrival=r.arrival + TRICKLE_START, request_id=f"b{r.request_id}")
                     for r in trickle]
            + [dataclasses.replace(r, arrival=r.arrival + lone_start, request_id=f"c{r.request_id}") for r in lone])


def calibration_steps(engine: LLMEngine, seed: int = 1, requests: int = 48) -> tuple[list[Step], list[bool]]:
    """The recorded steps of a calibration replay (calibration_workload), after a warm-up request: an
    engine's first step pays its set-up."""
    replay(engine, [SimRequest(0.0, 64, 2, request_id="warm-up")], seed)
    calibration = calibration_workload(requests, seed)
    _, steps, woke = recorded_steps(engine, lambda: replay(engine, calibration, seed))
    return steps, woke


def steps_since_idle(woke: list[bool]) -> list[int]:
    """For each recorded step, how many steps ran since the last idle pause (0: the step that ended it);
    the steps before the first pause count as warm (WARMUP_BINS[-1] and more)."""
    since, k = [], len(woke) + WARMUP_BINS[-1]
    for w in woke:
        k = 0 if w else k + 1
        since.append(k)
    return since


def fit_profile(steps: list[Step], woke: list[bool], source: str = "", rounds: int = 3) -> StepProfile:
    """StepProfile.fit, with what a cold replica costs: `warmup`, the median cost of the steps k after an
    idle pause (k = 0: the step that ends it) over a warm step's, by WARMUP_BINS (a bin with fewer than
    3 steps stays at 1). The two are fitted in turn: the price to each step's time over its bin's factor
    (so the spread is what is left), the factors to each step's time over its price."""
    since = steps_since_idle(woke)
    cold = [1.0] * len(steps)
    for _ in range(rounds):
        profile = StepProfile.fit([(p, d, c, t / f) for (p, d, c, t), f in zip(steps, cold)], source=source)
        ratios = [t / profile.step_time(p, d, c) for p, d, c, t in steps]
        warm = [r for r, k in zip(ratios, since) if k >= WARMUP_BINS[-1]]
        if not warm:
            break
        level = statistics.median(warm)
        bins = [[r for r, k in zip(ratios, since) if lo <= k < hi] for lo, hi in zip((0, *WARMUP_BINS), WARMUP_BINS)]
        warmup = tuple(statistics.median(b) / level if len(b) >= 3 else 1.0 for b in bins)
        profile = dataclasses.replace(profile, warmup=warmup)
        cold = [profile.cold(k) for k in since]
    return profile


def measure_profile(engine: LLMEngine, seed: int = 1, requests: int = 48) -> StepProfile:
    """Fit a StepProfile to the steps of a calibration replay (calibration_steps, fit_profile)."""
    steps, woke = calibration_steps(engine, seed, requests)
    return fit_profile(steps, woke, source=f"{engine.config.model} on this machine, {len(steps)} steps")
