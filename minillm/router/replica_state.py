"""What the router knows of its replicas, and the one place that changes it.

Per replica: whether it is in rotation, its load (requests in flight through this router), what
was routed there and how much failed, and a PrefixIndex of the prompts it was sent. A request asks
`pick` for a replica (the routing policy decides, over the same ReplicaView the simulator uses),
and hands it back with `release`; a connection failure takes the replica out with `mark_dead`, a
passing health check brings it back with `mark_alive`. Everything runs on the router's event loop,
so no lock is needed.
"""
from collections.abc import Collection
from dataclasses import dataclass, field

from minillm.router.policies import ReplicaView, make_policy
from minillm.router.prefix_index import PrefixIndex


class NoReplicaAlive(Exception):
    """Every replica (not already tried for this request) is out of rotation."""


@dataclass(eq=False)  # eq=False: replicas are told apart by identity, as keys of sets
class Replica:
    url: str
    index: PrefixIndex
    alive: bool = True
    in_flight: int = 0       # requests sent and not yet finished
    routed: int = 0          # requests sent here, retries included
    failures: int = 0        # of those, failed here (no connection, broken stream, 5xx)
    prompt_tokens: int = 0   # prompt tokens routed here
    hit_tokens: int = 0      # of those, cached according to the index when routed
    last_error: str = field(default="", repr=False)

    @property
    def hit_estimate(self) -> float:
        """hit_tokens / prompt_tokens: the share of prompt tokens the router expected cached."""
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


class RouterState:
    def __init__(self, urls: list[str], policy: str = "prefix_aware", block_size: int = 16,
                 index_capacity: int = 65_536) -> None:
        if not urls:
            raise ValueError("the router needs at least one replica URL, got none")
        for url in urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"a replica URL must start with http:// or https://, got {url!r}")
        self.policy = make_policy(policy)
        self.replicas = [Replica(url.rstrip("/"), PrefixIndex(block_size, index_capacity)) for url in urls]

    def pick(self, prompt_ids: list[int], exclude: Collection[Replica] = ()) -> Replica:
        """The policy's choice among the live replicas not in exclude; it counts as in flight until
        release(). Raises NoReplicaAlive when there is none."""
        views = [ReplicaView(r.in_flight, r.index.match(prompt_ids), r.alive and r not in exclude)
                 for r in self.replicas]
        if not any(v.alive for v in views):
            raise NoReplicaAlive(self.describe())
        i = self.policy.choose(views, len(prompt_ids))
        replica = self.replicas[i]
        replica.in_flight += 1
        replica.routed += 1
        replica.prompt_tokens += len(prompt_ids)
        replica.hit_tokens += views[i].cached_tokens
        replica.index.insert(prompt_ids)
        return replica

    def release(self, replica: Replica, failed: bool = False) -> None:
        replica.in_flight -= 1
        replica.failures += failed

    def mark_dead(self, replica: Replica, error: str) -> None:
        """Out of rotation until a health check passes; a replica that comes back starts with an empty
        cache, so its index is forgotten now."""
        replica.alive, replica.last_error = False, error
        replica.index.clear()

    def mark_alive(self, replica: Replica) -> None:
        replica.alive = True

    def describe(self) -> str:
        """One line on the fleet, for error messages: each replica and why it is out."""
        return "; ".join(f"{r.url} " + ("alive" if r.alive else f"out of rotation ({r.last_error or 'no error'})")
                         for r in self.replicas)
