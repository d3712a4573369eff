"""simulate(): a workload through a fleet of replicas behind a router, on SimPy's clock.

    result = simulate(requests, profile, replicas=4, router="prefix_aware")
    result.requests[0].token_times, result.samples[-1]   # per-request timings, the fleet over time

Requests arrive at their `arrival` times and the router places each on a replica. Variants:
- agent sessions (`sessions`): each call waits for the previous one and its tool pause;
- disaggregated (`prefill_replicas` > 0): prompts run on a prefill pool, their K/V travel to a decode
  pool (`transfer_seconds_per_token`), which decodes;
- autoscaled (`autoscaler`): the number of serving replicas follows a rule (minillm/sim/autoscale.py).
Every `sample_every` simulated seconds the fleet's queues and KV use are recorded (the app animates them).
"""
from dataclasses import dataclass, field

import simpy

from minillm.router.policies import ReplicaView, make_policy
from minillm.sim.autoscale import Autoscaler, FleetState
from minillm.sim.replica import Replica, SimRequest
from minillm.sim.step_profile import StepProfile


@dataclass(frozen=True)
class SimSession:
    """An agent session: calls one after another, each waiting for the previous one and its tool.
    Call k's prompt is the whole history (system prompt, earlier calls, their outputs and tool results)
    plus new_tokens; so each call shares all but its newest tokens with the last."""
    start: float
    calls: tuple[tuple[int, int], ...]   # (new prompt tokens, output tokens) per call
    tool_seconds: float                  # the pause between a call's answer and the next call
    system: tuple[str, int] = ("system", 0)  # the shared system prompt: (name, tokens)
    name: str = "session"


@dataclass
class SimResult:
    requests: list[SimRequest]
    replicas: list[Replica]         # every replica that served (decode pool first when disaggregated)
    duration: float                 # simulated seconds until the last request finished
    samples: list[dict] = field(default_factory=list)  # {"time", "waiting": [...], "running": [...], "kv": [...]}
    replica_seconds: float = 0.0    # replicas held (serving, starting or draining) x seconds: what the fleet cost


def simulate(requests: list[SimRequest], profile: StepProfile, replicas: int = 1, router: str = "round_robin",
             sample_every: float | None = None, sessions: list[SimSession] = (), prefill_replicas: int = 0,
             transfer_seconds_per_token: float = 0.0, autoscaler: Autoscaler | None = None, seed: int = 0,
             **replica_options) -> SimResult:
    """Run requests (arrival times in seconds from 0) and agent sessions to completion; a session's calls
    are added to the result's requests as they are made. replica_options: Replica's knobs (max_num_seqs,
    max_num_batched_tokens, kv_blocks, block_size, prefix_cache_tokens). seed: of the step times drawn
    from a measured profile's spread (the same seed, the same run)."""
    if replicas < 1 or prefill_replicas < 0:
        raise ValueError(f"need replicas >= 1 and prefill_replicas >= 0, got {replicas}, {prefill_replicas}")
    if autoscaler is not None and prefill_replicas:
        raise ValueError("autoscaling a disaggregated fleet is not modelled: give autoscaler or prefill_replicas")
    env = simpy.Environment()
    policy = make_policy(router)
    ordered = sorted(requests, key=lambda r: r.arrival)
    role = "decode" if prefill_replicas else "mixed"
    fleet = [Replica(env, profile, index=i, role=role, seed=seed, **replica_options) for i in range(replicas)]
    decode_policy = make_policy("least_loaded")

    def handoff(r: SimRequest) -> None:  # a prefill replica finished r's prompt: its K/V travel to a decoder
        env.process(transfer(r))

    def transfer(r: SimRequest):
        yield env.timeout(transfer_seconds_per_token * r.prompt_tokens)
        r.prefilled = True
        views = [ReplicaView(x.load, 0, x.alive) for x in fleet]
        fleet[decode_policy.choose(views, r.prompt_tokens)].submit(r)

    prefill = [Replica(env, profile, index=replicas + i, role="prefill", handoff=handoff, seed=seed, **replica_options)
               for i in range(prefill_replicas)]
    entry = prefill or fleet  # where new requests go

    def route(r: SimRequest) -> None:
        views = [ReplicaView(x.load, x.expected_prefix(r), x.alive) for x in entry]
        entry[policy.choose(views, r.prompt_tokens)].submit(r)

    def arrivals():
        for r in list(ordered):
            if r.arrival > env.now:  # requests arriving together are all placed before any replica steps
                yield env.timeout(r.arrival - env.now)
            route(r)

    def session(s: SimSession):
        yield env.timeout(s.start)
        history = s.system[1]
        for k, (new, out) in enumerate(s.calls):
            prefix = s.system if k == 0 else (s.name, history)
            r = SimRequest(env.now, history + new, out, prefix=prefix, request_id=f"{s.name}.{k}", done=env.event(),
                           leaves=(s.name, history + new + out))
            ordered.append(r)
            route(r)
            yield r.done
            history += new + out
            if k + 1 < len(s.calls):
                yield env.timeout(s.tool_seconds)

    sources = [env.process(arrivals())] + [env.process(session(s)) for s in sessions]
    work_left = lambda: any(p.is_alive for p in sources) or any(not r.finished for r in ordered)
    samples: list[dict] = []
    cost = {"replica_seconds": 0.0, "last": 0.0, "held": replicas + prefill_replicas}

    def sampler():
        while work_left():
            everyone = fleet + prefill
            samples.append({"time": env.now, "waiting": [len(x.waiting) for x in everyone],
                            "running": [len(x.running) for x in everyone],
                            "kv": [x.used_blocks() / x.kv_blocks for x in everyone],
                            "alive": [x.alive for x in everyone]})
            yield env.timeout(sample_every)

    def hold(count: int) -> None:  # the fleet's cost so far, then its new size
        cost["replica_seconds"] += cost["held"] * (env.now - cost["last"])
        cost["last"], cost["held"] = env.now, count

    starting = [0]  # replicas asked for that do not serve yet

    def autoscale(a: Autoscaler):
        while work_left():
            yield env.timeout(a.interval)
            alive = [x for x in fleet if x.alive]
            state = FleetState(env.now, len(alive), starting[0], sum(len(x.waiting) for x in fleet),
                               sum(len(x.running) for x in fleet))
            want = max(a.min_replicas, min(a.max_replicas, a.rule(state)))
            for _ in range(want - len(alive) - starting[0]):
                starting[0] += 1
                env.process(start_replica(a))
            for x in alive[want:] if want < len(alive) else []:  # the newest drain: no new requests, leave when empty
                x.alive = False
            hold(sum(1 for x in fleet if x.alive or x.load) + starting[0])

    def start_replica(a: Autoscaler):
        yield env.timeout(a.startup_seconds)
        starting[0] -= 1
        fleet.append(Replica(env, profile, index=len(fleet), seed=seed, **replica_options))

    if autoscaler is not None:
        env.process(autoscale(autoscaler))
    if sample_every:
        env.process(sampler())
    env.run()  # until no event is left: every request has finished, every replica waits
    hold(0)
    unfinished = [r.request_id for r in ordered if not r.finished]
    if unfinished:
        raise RuntimeError(f"{len(unfinished)} requests never finished (first: {unfinished[:3]})")
    return SimResult(ordered, fleet + prefill, max((r.token_times[-1] for r in ordered), default=0.0), samples,
                     cost["replica_seconds"])
