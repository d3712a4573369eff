"""Autoscaling the simulated fleet: a rule reads the fleet every `interval` seconds and names how
many replicas it wants; new ones serve only after `startup_seconds` (loading weights, warming up),
surplus ones stop receiving requests and leave once they have drained.

    autoscaler = Autoscaler(rule=queue_rule(per_replica=8), interval=5, startup_seconds=30)
    simulate(requests, profile, replicas=2, autoscaler=autoscaler)   # result.replica_seconds: what it cost
"""
import math
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class FleetState:
    now: float          # simulated seconds
    replicas: int       # serving (alive)
    starting: int       # asked for, not serving yet
    waiting: int        # requests queued, over the fleet
    running: int        # requests running, over the fleet


@dataclass(frozen=True)
class Autoscaler:
    rule: Callable[[FleetState], int]   # -> the replicas wanted (clamped to min..max)
    interval: float = 5.0
    startup_seconds: float = 30.0
    min_replicas: int = 1
    max_replicas: int = 64

    def __post_init__(self) -> None:
        if not 1 <= self.min_replicas <= self.max_replicas:
            raise ValueError(f"need 1 <= min_replicas <= max_replicas, got {self.min_replicas}, {self.max_replicas}")
        if self.interval <= 0 or self.startup_seconds < 0:
            raise ValueError(f"interval must be > 0 and startup_seconds >= 0, got {self.interval}, "
                             f"{self.startup_seconds}")


def queue_rule(per_replica: float = 8.0) -> Callable[[FleetState], int]:
    """Enough replicas that each holds about `per_replica` requests (waiting + running)."""
    def rule(state: FleetState) -> int:
        return math.ceil((state.waiting + state.running) / per_replica)
    return rule


def fixed_rule(replicas: int) -> Callable[[FleetState], int]:
    """No autoscaling: always the same number (the baseline to compare against)."""
    return lambda state: replicas
