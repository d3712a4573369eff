"""Replica: one simulated engine, batching continuously as minillm's scheduler does.

Each step: every running decode computes one token, then the waiting queue is admitted first come
first served while the step's token budget, the sequence cap and the KV blocks allow; a prompt too
long for what is left of the budget is chunked over several steps. The step lasts what the
StepProfile says (its price, times the profile's warmup factor in the first steps after the replica
was idle, times a ratio drawn from the profile's measured spread if it has one, at a pace that
persists from step to step as the measured one did, by the replica's own seeded generator, so a
simulation repeats exactly); its decodes (and the prompts it finished) get their token when it ends.
A prefix the replica computed before (a shared system prompt, an agent session's earlier calls) is
found in its prefix cache and not computed again.
"""
import random
from collections import OrderedDict
from dataclasses import dataclass, field

import simpy

from minillm.arith import cdiv
from minillm.sim.step_profile import StepProfile


@dataclass
class SimRequest:
    """A request of the simulated workload. prefix: (name, tokens) of a prompt prefix that other
    requests share (a system prompt, a session's history); None: nothing shared."""
    arrival: float
    prompt_tokens: int
    output_tokens: int
    prefix: tuple[str, int] | None = None
    request_id: str = ""
    # Filled in by the simulation:
    replica: int | None = None
    first_scheduled: float | None = None
    token_times: list[float] = field(default_factory=list)
    cached_tokens: int = 0
    computed: int = 0           # prompt tokens whose K/V are computed (cached ones count)
    done: object = None         # a simpy event the replica triggers when the request finishes (agent sessions)
    leaves: tuple[str, int] | None = None  # what it leaves cached when it finishes: a session's (name, tokens)
    prefilled: bool = False     # disaggregated: its prompt's K/V arrived from a prefill replica

    @property
    def finished(self) -> bool:
        return len(self.token_times) >= self.output_tokens


def copies(requests: list[SimRequest]) -> list[SimRequest]:
    """Fresh requests with the same arrivals and lengths (a simulation fills its requests in)."""
    return [SimRequest(r.arrival, r.prompt_tokens, r.output_tokens, r.prefix, r.request_id) for r in requests]


class Replica:
    def __init__(self, env: simpy.Environment, profile: StepProfile, index: int = 0, max_num_seqs: int = 64,
                 max_num_batched_tokens: int = 1024, kv_blocks: int = 4096, block_size: int = 16,
                 prefix_cache_tokens: int | None = None, role: str = "mixed", handoff=None, seed: int = 0) -> None:
        """role: "mixed" (prefill and decode, the colocated engine), "prefill" (computes prompts and their first
        token, then hands each request to `handoff(request)`), or "decode" (receives prefilled requests)."""
        if role not in ("mixed", "prefill", "decode"):
            raise ValueError(f"role must be mixed, prefill or decode, got {role!r}")
        if role == "prefill" and handoff is None:
            raise ValueError("a prefill replica needs a handoff(request) for its finished prompts")
        self.env, self.profile, self.index = env, profile, index
        self.max_num_seqs, self.budget = max_num_seqs, max_num_batched_tokens
        self.kv_blocks, self.block_size = kv_blocks, block_size
        self.waiting: list[SimRequest] = []
        self.running: list[SimRequest] = []
        self.prefixes: OrderedDict[str, int] = OrderedDict()  # prefix name -> tokens cached, least recent first
        self.routed: OrderedDict[str, int] = OrderedDict()    # prefix name -> tokens sent here (will be cached)
        self.prefix_capacity = kv_blocks * block_size // 2 if prefix_cache_tokens is None else prefix_cache_tokens
        self.role, self.handoff = role, handoff
        self.rng = random.Random(f"replica {index}, seed {seed}")  # draws each step's share of the spread
        self.pace = self.rng.gauss(0.0, 1.0) if profile.persistence and profile.spread else 0.0  # (pace.py)
        self.busy_time = 0.0
        self.steps = 0
        self.since_idle = 0     # steps since the replica last went idle (a cold replica's steps cost more)
        self.alive = True       # False: draining (autoscaled away) or dead; the router sends it nothing
        self.started = env.now
        self._wake = env.event()
        env.process(self._loop())

    # -- what a router sees ----------------------------------------------------------------
    @property
    def load(self) -> int:
        return len(self.waiting) + len(self.running)

    def cached_prefix(self, request: SimRequest) -> int:
        """Prompt tokens of request this replica's prefix cache holds."""
        if request.prefix is None:
            return 0
        name, tokens = request.prefix
        return min(self.prefixes.get(name, 0), tokens)

    def expected_prefix(self, request: SimRequest) -> int:
        """Prompt tokens of request the cache will hold when it runs: held now, or sent here already and
        computed before it (the queue is first come, first served). What a cache-aware router tracks."""
        if request.prefix is None:
            return 0
        name, tokens = request.prefix
        return min(max(self.prefixes.get(name, 0), self.routed.get(name, 0)), tokens)

    def used_blocks(self) -> int:
        return sum(self._blocks(r) for r in self.running)

    # -- the engine ------------------------------------------------------------------------
    def submit(self, request: SimRequest) -> None:
        if self._blocks(request) > self.kv_blocks:
            raise ValueError(f"request {request.request_id!r} needs {self._blocks(request)} KV blocks, more than the "
                             f"replica's {self.kv_blocks}")
        request.replica = self.index
        if request.prefix is not None:
            _remember(self.routed, request.prefix[0], request.prefix[1], self.prefix_capacity)
        self.waiting.append(request)
        if not self._wake.triggered:
            self._wake.succeed()

    def _blocks(self, r: SimRequest) -> int:
        return cdiv(r.prompt_tokens + r.output_tokens, self.block_size)  # reserved for its whole life

    def _schedule(self) -> tuple[int, int, int, list[SimRequest]]:
        """-> (prefill tokens, decode seqs, context tokens, prompts this step finishes)."""
        decodes = [r for r in self.running if r.computed >= r.prompt_tokens]
        budget = self.budget - len(decodes)
        context = sum(r.prompt_tokens + len(r.token_times) for r in decodes)
        prefill, finishing = 0, []
        free = self.kv_blocks - self.used_blocks()
        for r in [r for r in self.running if r.computed < r.prompt_tokens]:  # chunked prompts continue first
            take = min(r.prompt_tokens - r.computed, budget - prefill)
            r.computed += take
            prefill += take
            finishing += [r] if r.computed == r.prompt_tokens else []
        while self.waiting and len(self.running) < self.max_num_seqs and prefill < budget:
            r = self.waiting[0]
            if self._blocks(r) > free:
                break
            self.waiting.pop(0)
            free -= self._blocks(r)
            self.running.append(r)
            if r.prefilled:  # its K/V came from a prefill replica: it decodes at once
                budget -= 1
                context += r.prompt_tokens + len(r.token_times)
                decodes.append(r)
                continue
            r.first_scheduled = self.env.now
            r.cached_tokens = r.computed = min(self.cached_prefix(r), r.prompt_tokens - 1)  # the last is computed
            take = min(r.prompt_tokens - r.computed, budget - prefill)
            r.computed += take
            prefill += take
            finishing += [r] if r.computed == r.prompt_tokens else []
        return prefill, len(decodes), context, decodes + finishing

    def _loop(self):
        while True:
            if not self.running and not self.waiting:
                self._wake = self.env.event()
                yield self._wake
                self.since_idle = 0
            prefill, decode_seqs, context, sampled = self._schedule()  # never empty: a lone request always fits
            price = self.profile.step_time(prefill, decode_seqs, context)
            ratio, self.pace = self.profile.draw(self.rng, self.pace, price)
            duration = price * self.profile.cold(self.since_idle) * ratio
            yield self.env.timeout(duration)
            self.busy_time += duration
            self.steps += 1
            self.since_idle += 1
            for r in sampled:
                if not r.token_times and r.prefix is not None:  # its prompt is computed: the prefix is cached
                    _remember(self.prefixes, r.prefix[0], r.prefix[1], self.prefix_capacity)
                r.token_times.append(self.env.now)
            if self.role == "prefill":  # its prompts leave with their first token
                for r in [r for r in sampled if len(r.token_times) == 1 and not r.finished]:
                    self.running.remove(r)
                    self.handoff(r)
            for r in [r for r in self.running if r.finished]:
                self.running.remove(r)
                if r.leaves is not None:
                    _remember(self.prefixes, *r.leaves, self.prefix_capacity)
                if r.done is not None:
                    r.done.succeed()


def _remember(cache: OrderedDict, name: str, tokens: int, capacity: int) -> None:
    """Mark name as most recently used with at least `tokens`; drop the least recent beyond capacity."""
    cache[name] = max(cache.pop(name, 0), tokens)
    while sum(cache.values()) > capacity and len(cache) > 1:
        cache.popitem(last=False)
