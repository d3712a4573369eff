"""Routing policies: which replica serves a request. The router owns them; the simulator imports them.

Each policy sees, per replica, how loaded it is and how many of the request's prompt tokens its
prefix cache holds, and returns the replica's index:
- round_robin: in turn, blind to both;
- least_loaded: the fewest requests waiting or running;
- prefix_aware: the most cached prompt tokens, unless that replica is much busier than the least
  loaded one (then the load wins): a cache hit saves prefill, a long queue costs more.
"""
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ReplicaView:
    load: int              # requests waiting or running
    cached_tokens: int     # of this request's prompt, held by the replica's prefix cache
    alive: bool = True


class RoundRobin:
    def __init__(self) -> None:
        self._next = 0

    def choose(self, replicas: Sequence[ReplicaView], prompt_tokens: int) -> int:
        for _ in range(len(replicas)):
            i, self._next = self._next, (self._next + 1) % len(replicas)
            if replicas[i].alive:
                return i
        raise RuntimeError("no replica is alive")


class LeastLoaded:
    def choose(self, replicas: Sequence[ReplicaView], prompt_tokens: int) -> int:
        return min(_alive(replicas), key=lambda i: (replicas[i].load, i))


class PrefixAware:
    """The replica holding the most of the prompt, while its load is within `slack` requests of the
    least loaded replica's (a hit is worth at most a few requests' queueing)."""

    def __init__(self, slack: int = 4) -> None:
        self.slack = slack

    def choose(self, replicas: Sequence[ReplicaView], prompt_tokens: int) -> int:
        alive = _alive(replicas)
        lightest = min(replicas[i].load for i in alive)
        near = [i for i in alive if replicas[i].load <= lightest + self.slack]
        return max(near, key=lambda i: (replicas[i].cached_tokens, -replicas[i].load, -i))


POLICIES = {"round_robin": RoundRobin, "least_loaded": LeastLoaded, "prefix_aware": PrefixAware}


def make_policy(policy):
    """A policy by name, or a policy object itself (anything with choose(replicas, prompt_tokens)): a lab's."""
    if hasattr(policy, "choose"):
        return policy
    if policy not in POLICIES:
        raise ValueError(f"routing policy must be one of {', '.join(POLICIES)} (or an object with a choose "
                         f"method), got {policy!r}")
    return POLICIES[policy]()


def _alive(replicas: Sequence[ReplicaView]) -> list[int]:
    alive = [i for i, r in enumerate(replicas) if r.alive]
    if not alive:
        raise RuntimeError("no replica is alive")
    return alive
