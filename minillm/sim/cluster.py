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


@dataclass
class SimResult:
    requests: list[SimRequest]
    replicas: list[Replica]
    duration: float                 # simulated seconds until the last request finished
    samples: list[dict] = field(default_factory=list)  # {"time", "waiting": [...], "running": [...], "kv": [...]}


def simulate(requests: list[SimRequest], profile: StepProfile, replicas: int = 1, router: str = "round_robin",
             sample_every: float | None = None, **replica_options) -> SimResult:
    """Run requests (arrival times in seconds from 0) to completion. replica_options: Replica's knobs
    (max_num_seqs, max_num_batched_tokens, kv_blocks, block_size, prefix_cache_tokens)."""
    if replicas < 1:
        raise ValueError(f"replicas must be >= 1, got {replicas}")
    env = simpy.Environment()
    fleet = [Replica(env, profile, index=i, **replica_options) for i in range(replicas)]
    policy = make_policy(router)
    ordered = sorted(requests, key=lambda r: r.arrival)

    def arrivals():
        for r in ordered:
            if r.arrival > env.now:  # requests arriving together are all placed before any replica steps
                yield env.timeout(r.arrival - env.now)
            views = [ReplicaView(x.load, x.expected_prefix(r), x.alive) for x in fleet]
            fleet[policy.choose(views, r.prompt_tokens)].submit(r)

    samples: list[dict] = []

    def sampler():
        while not all(r.finished for r in ordered):
            samples.append({"time": env.now, "waiting": [len(x.waiting) for x in fleet],
                            "running": [len(x.running) for x in fleet],
                            "kv": [x.used_blocks() / x.kv_blocks for x in fleet]})
            yield env.timeout(sample_every)

    env.process(arrivals())
    if sample_every:
        env.process(sampler())
    env.run()  # until no event is left: every request has finished, every replica waits
    unfinished = [r.request_id for r in ordered if not r.finished]
    if unfinished:
        raise RuntimeError(f"{len(unfinished)} requests never finished (first: {unfinished[:3]})")
    return SimResult(ordered, fleet, max((r.token_times[-1] for r in ordered), default=0.0), samples)
