"""The cluster page's simulations: a fleet of replicas on a roofline (or this machine's measured) step
profile, serving seeded agent sessions; and one or two replicas of the real engine beside their simulation.

    profile, knobs = roofline_replica("Llama-3.1-8B", "H100 SXM")     # or measured_replica("tiny")
    run = simulate_fleet(profile, knobs, Traffic(40, 1.0, 0.5, 4), Fleet(8, "prefix_aware"))
    run.samples["kv"][t][r]      # replica r's share of KV blocks in use at sample t
    latency_windows(run.requests, width)                             # TTFT / TPOT p50, p99 per arrival window

Simulations are cached by their settings (st.cache_data): moving the time slider, or coming back to a
fleet, costs nothing. The measured profile is fitted once per server (st.cache_resource).
"""
from dataclasses import dataclass

import streamlit as st

from minillm import EngineConfig
from minillm.arith import cdiv
from minillm.perf import PROFILES, kv_bytes_per_token, model_shape, param_count
from minillm.perf.serving import percentile, request_metrics
from minillm.sim import StepProfile, simulate
from minillm.sim.autoscale import Autoscaler, queue_rule
from minillm.sim.calibrate import (
    CALIBRATION_REQUESTS,
    alone_seconds,
    fit_profile,
    measure_profile,
    replay,
    replica_knobs,
    workload,
)
from minillm.sim.fleet_replay import replay_fleet
from minillm.sim.plan import predict, records, summary
from minillm.sim.workloads import agent_sessions
from minillm_visualizer.shared.engines import build_engine

THIS_MACHINE = "This machine (measured)"
DTYPE = "bfloat16"                 # weights and K/V on a GPU
BLOCK_SIZE = 16
MEMORY_FOR_MODEL = 0.9             # of a GPU's memory: the rest is activations, the CUDA context, fragmentation
LINK_BYTES_PER_S = 50e9            # prefill -> decode K/V hand-off: one 400 Gb/s InfiniBand link
SLO = {"ttft": 1.0, "tpot": 0.05}  # seconds: an interactive service (the capacity plan of bench cluster)
SAMPLE_EVERY_S = 0.25
MAX_FRAMES = 160                   # samples kept for the charts: the animation stays light in the browser
SPLITS = {"off": None, "1:3": (1, 3), "1:1": (1, 1), "3:1": (3, 1)}  # prefill : decode replicas


@dataclass(frozen=True)
class Traffic:
    """Agent sessions (minillm.sim.workloads.agent_sessions): `sessions` of them starting at `rate` per second
    with gamma gaps of shape `burstiness` (1: Poisson, < 1: bursts), each of one of `tenants` system prompts."""
    sessions: int
    rate: float
    burstiness: float
    tenants: int
    seed: int = 0


@dataclass(frozen=True)
class Fleet:
    replicas: int                  # all of them: prefill and decode together when disaggregated
    router: str
    split: str = "off"             # a key of SPLITS
    autoscale: bool = False        # replicas then start at `replicas` and follow queue_rule(per_replica)
    per_replica: float = 8.0       # requests (waiting + running) each replica should hold, for the autoscaler
    startup_s: float = 30.0        # a new replica serves this long after it is asked for

    def pools(self) -> tuple[int, int]:
        """-> (prefill replicas, decode-or-mixed replicas). Raises ValueError for a split the fleet cannot make."""
        if self.split not in SPLITS:
            raise ValueError(f"the prefill:decode split must be one of {', '.join(SPLITS)}, got {self.split!r}")
        if SPLITS[self.split] is None:
            return 0, self.replicas
        if self.replicas < 2:
            raise ValueError(f"disaggregation needs at least 2 replicas (one prefill, one decode), got {self.replicas}")
        if self.autoscale:
            raise ValueError("the simulator does not autoscale a disaggregated fleet: turn one of them off")
        p, d = SPLITS[self.split]
        prefill = min(max(1, round(self.replicas * p / (p + d))), self.replicas - 1)
        return prefill, self.replicas - prefill


@dataclass
class ClusterRun:
    """A finished simulation as plain lists (picklable, so st.cache_data can keep it)."""
    requests: list[dict]   # per call: arrival, replica, prompt, cached, output, ttft, tpot (None: 1 token), end
    samples: dict          # "time": [T]; "waiting", "running", "kv": [T][replicas] (None: not started yet)
    labels: list[str]      # replica names, in the samples' order: "R3" serves both phases, "P0" prefill, "D1" decode
    summary: dict          # minillm.sim.plan.summary with SLO
    duration: float        # simulated seconds, first arrival to the last token
    replica_seconds: float
    calls_made: int        # the calls the sessions asked for (each one a request)


def roofline_replica(model: str, gpu: str) -> tuple[StepProfile, dict]:
    """A replica of `model` on one `gpu`: step costs from the roofline; a KV pool of what the GPU's memory
    holds once the weights are in: (0.9 x memory - weights) // (K/V bytes per token x block size) blocks."""
    cfg, hardware = model_shape(model), PROFILES[gpu]
    weights = (param_count(cfg) + (0 if cfg.tie_word_embeddings else cfg.vocab_size * cfg.hidden_size)) * 2
    per_block = kv_bytes_per_token(cfg, DTYPE) * BLOCK_SIZE
    blocks = int(MEMORY_FOR_MODEL * hardware.memory_bytes - weights) // per_block
    if blocks < 1:
        raise ValueError(f"{model}'s weights ({weights / 1e9:.0f} GB in {DTYPE}) leave no room for a KV cache in "
                         f"{MEMORY_FOR_MODEL:.0%} of one {gpu}'s {hardware.memory_bytes / 1e9:.0f} GB (tensor "
                         "parallelism is not simulated): choose a smaller model or a larger GPU")
    knobs = {"kv_blocks": blocks, "block_size": BLOCK_SIZE, "max_num_seqs": 256, "max_num_batched_tokens": 8192}
    return StepProfile.from_roofline(cfg, hardware, dtype=DTYPE), knobs


def engine_config(model: str) -> EngineConfig:
    """The real replica: random-token prompts share nothing, so the prefix cache stays off (as in bench cluster)."""
    return EngineConfig.from_knobs(model, max_num_seqs=16, enable_prefix_caching=False)


@st.cache_resource(show_spinner="Measuring this machine's step costs on the real engine (once per server)...")
def measured_replica(model: str) -> tuple[StepProfile, dict]:
    """`model` on this machine: StepProfile fitted to a calibration replay, and the engine's own knobs."""
    engine = build_engine(engine_config(model))
    return measure_profile(engine, requests=CALIBRATION_REQUESTS[True]), replica_knobs(engine)


def transfer_seconds_per_token(model: str, dtype: str = DTYPE) -> float:
    """A token's K/V (every layer) over the link between the prefill and the decode pool."""
    return kv_bytes_per_token(model_shape(model), dtype) / LINK_BYTES_PER_S


@st.cache_data(show_spinner="Simulating the fleet...", max_entries=32)
def simulate_fleet(profile: StepProfile, knobs: dict, traffic: Traffic, fleet: Fleet,
                   transfer_s_per_token: float = 0.0) -> ClusterRun:
    """The sessions through the fleet; raises ValueError (in words) for a fleet or request that cannot be."""
    prefill, decode = fleet.pools()
    sessions = agent_sessions(traffic.sessions, traffic.rate, seed=traffic.seed, tenants=traffic.tenants,
                              burstiness=traffic.burstiness)
    autoscaler = (Autoscaler(queue_rule(fleet.per_replica), startup_seconds=fleet.startup_s,
                             max_replicas=max(64, fleet.replicas)) if fleet.autoscale else None)
    result = simulate([], profile, replicas=decode, router=fleet.router, sample_every=SAMPLE_EVERY_S,
                      sessions=sessions, prefill_replicas=prefill, autoscaler=autoscaler,
                      transfer_seconds_per_token=transfer_s_per_token if prefill else 0.0, **knobs)
    labels = ([f"D{i}" for i in range(decode)] + [f"P{i}" for i in range(prefill)] if prefill
              else [f"R{i}" for i in range(len(result.replicas))])
    return ClusterRun(request_rows(result.requests), thin(result.samples, len(labels)), labels,
                      summary(result.requests, SLO), result.duration, result.replica_seconds,
                      sum(len(s.calls) for s in sessions))


def request_rows(requests) -> list[dict]:
    rows = []
    for r, rec in zip(requests, records(requests)):
        m = request_metrics(rec)
        rows.append({"arrival": r.arrival, "replica": r.replica, "prompt": r.prompt_tokens, "cached": r.cached_tokens,
                     "output": r.output_tokens, "ttft": m.ttft, "tpot": m.tpot, "end": r.token_times[-1]})
    return rows


def thin(samples: list[dict], replicas: int) -> dict:
    """At most MAX_FRAMES evenly spaced samples, each list padded to the whole fleet (an autoscaled replica is
    None before it started). -> {"time": [T], "waiting" | "running" | "kv" | "alive": [T][replicas]}."""
    step = max(1, cdiv(len(samples), MAX_FRAMES))
    kept = samples[::step]
    if samples and kept[-1] is not samples[-1]:
        kept.append(samples[-1])
    out = {"time": [s["time"] for s in kept]}
    for name in ("waiting", "running", "kv", "alive"):
        out[name] = [s[name] + [None] * (replicas - len(s[name])) for s in kept]
    return out


def latency_windows(requests: list[dict], width: float) -> list[dict]:
    """Requests grouped by arrival into windows [k * width, (k + 1) * width): per window its start, the requests,
    TTFT p50 / p99 and TPOT p50 / p99 (seconds; linear-interpolation percentiles, numpy's default)."""
    if width <= 0:
        raise ValueError(f"the window width must be > 0 seconds, got {width}")
    groups: dict[int, list[dict]] = {}
    for r in requests:
        groups.setdefault(int(r["arrival"] // width), []).append(r)
    rows = []
    for k in range(max(groups) + 1 if groups else 0):
        group = groups.get(k, [])
        ttft = [r["ttft"] for r in group]
        tpot = [r["tpot"] for r in group if r["tpot"] is not None]
        rows.append({"start": k * width, "requests": len(group),
                     **{f"ttft_p{q}": percentile(ttft, q) for q in (50, 99)},
                     **{f"tpot_p{q}": percentile(tpot, q) for q in (50, 99)}})
    return rows


COMPARED = [("output tok/s", "output_throughput"), ("TTFT p50 (s)", "ttft_median"), ("TTFT p99 (s)", "ttft_p99"),
            ("TPOT p50 (s)", "tpot_median"), ("TPOT p99 (s)", "tpot_p99")]


def real_vs_simulated(model: str, requests: int, utilisation: float, replicas: int = 1,
                      seed: int = 10) -> tuple[list[dict], dict]:
    """The real engine and its simulation on the same small workload (bench cluster's check): one replica here,
    or two in processes of their own behind round robin (each calibrates first; their steps make the profile).
    utilisation: the arrival rate, per replica, as a share of what one replica serves one mean request at a time.
    -> (one row per figure: real, simulated, error = (simulated - real) / real; the workload's description)."""
    if replicas not in (1, 2):
        raise ValueError(f"the real run has 1 or 2 replicas, got {replicas}")
    profile, knobs = measured_replica(model)
    rate = replicas * utilisation / alone_seconds(profile)
    work = workload(requests, rate, seed=seed)
    if replicas == 1:
        real = summary(replay(build_engine(engine_config(model)), work))
    else:
        calibration, _, knobs, ran = replay_fleet(model, work, replicas, CALIBRATION_REQUESTS[True])
        profile = fit_profile(*calibration, source=f"{model} in {replicas} processes on this machine, "
                                                   f"{len(calibration[0])} steps")
        real = summary(ran)
    sim = predict(work, profile, replicas=replicas, router="round_robin", **knobs)  # the median of seeded runs
    rows = [{"figure": label, "real": real[key], "simulated": sim[key], "error": (sim[key] - real[key]) / real[key]}
            for label, key in COMPARED]
    rows.append({"figure": "requests completed", "real": real["completed"], "simulated": sim["completed"],
                 "error": (sim["completed"] - real["completed"]) / real["completed"]})
    return rows, {"requests": requests, "rate": rate, "replicas": replicas, "profile": profile}
