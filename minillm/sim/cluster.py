"""simulate(): a workload through N replicas behind a router, on SimPy's clock.

    result = simulate(requests, profile, replicas=4, router="prefix_aware")
    result.requests[0].token_times, result.samples[-1]   # per-request timings, the fleet over time

Requests arrive at their `arrival` times; the router places each on a replica at arrival; every
`sample_every` simulated seconds the fleet's queues and KV use are recorded (the app animates them).
"""
from dataclasses import dataclass, field

import simpy

from minillm.sim.profile import StepProfile
from minillm.sim.replica import Replica, SimRequest
from minillm.sim.routing import ReplicaView, make_policy


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
    replicas: list[Replica]
    duration: float                 # simulated seconds until the last request finished
    samples: list[dict] = field(default_factory=list)  # {"time", "waiting": [...], "running": [...], "kv": [...]}


def simulate(requests: list[SimRequest], profile: StepProfile, replicas: int = 1, router: str = "round_robin",
             sample_every: float | None = None, sessions: list[SimSession] = (), **replica_options) -> SimResult:
    """Run requests (arrival times in seconds from 0) and agent sessions to completion; a session's calls
    are added to the result's requests as they are made. replica_options: Replica's knobs (max_num_seqs,
    max_num_batched_tokens, kv_blocks, block_size, prefix_cache_tokens)."""
    if replicas < 1:
        raise ValueError(f"replicas must be >= 1, got {replicas}")
    env = simpy.Environment()
    fleet = [Replica(env, profile, index=i, **replica_options) for i in range(replicas)]
    policy = make_policy(router)
    ordered = sorted(requests, key=lambda r: r.arrival)

    def route(r: SimRequest) -> None:
        views = [ReplicaView(x.load, x.expected_prefix(r), x.alive) for x in fleet]
        fleet[policy.choose(views, r.prompt_tokens)].submit(r)

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

    samples: list[dict] = []

    def sampler():
        while not all(r.finished for r in ordered):
            samples.append({"time": env.now, "waiting": [len(x.waiting) for x in fleet],
                            "running": [len(x.running) for x in fleet],
                            "kv": [x.used_blocks() / x.kv_blocks for x in fleet]})
            yield env.timeout(sample_every)

    env.process(arrivals())
    for s in sessions:
        env.process(session(s))
    if sample_every:
        env.process(sampler())
    env.run()  # until no event is left: every request has finished, every replica waits
    unfinished = [r.request_id for r in ordered if not r.finished]
    if unfinished:
        raise RuntimeError(f"{len(unfinished)} requests never finished (first: {unfinished[:3]})")
    return SimResult(ordered, fleet, max((r.token_times[-1] for r in ordered), default=0.0), samples)
