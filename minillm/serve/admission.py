"""Admission control: take a request in, or turn it away with `429 Too Many Requests` and a
`Retry-After` that says when the queue will have room.

A server that queues everything looks healthy while every request's TTFT grows without bound;
refusing early keeps the admitted requests fast and tells clients to back off. The estimate:

    excess = num_waiting - max_waiting + 1        # queued sequences ahead of room for this one
    Retry-After = max(1, ceil(excess / drain_rate))   seconds, drain_rate in sequences/s

The server counts sequences, not requests: one request with 200 prompts and n = 4 brings 800, so
it passes num_waiting = (sequences queued) + (its own) - 1.

With no request drained recently (drain_rate 0), one request per second is assumed.
`build_app(..., admission=fn)` takes any function with this signature (lab 08 writes its own).
"""
import math
import time
from collections import deque


def admit(num_waiting: int, max_waiting: int, drain_rate: float) -> float | None:
    """None to admit the request, else the seconds to wait before retrying (>= 1)."""
    if num_waiting < max_waiting:
        return None
    excess = num_waiting - max_waiting + 1
    return float(max(1, math.ceil(excess / (drain_rate if drain_rate > 0 else 1.0))))


class DrainRate:
    """Sequences finished per second while the engine is busy: over the latest run of completions
    with no gap longer than `idle_gap` seconds between them (at most the last `keep`). A window of
    wall time would count the idle minutes before a burst too, and read a busy engine as slow
    (a Retry-After of 207 s for a backlog that cleared in 6.6 s)."""

    def __init__(self, keep: int = 64, idle_gap: float = 2.0) -> None:
        self.idle_gap = idle_gap
        self.times: deque[float] = deque(maxlen=keep)

    def record(self, count: int = 1) -> None:
        now = time.monotonic()
        self.times.extend([now] * count)

    def rate(self) -> float:
        """0.0 until two completions of one busy run are known (admit then assumes one per second)."""
        times = list(self.times)
        first = len(times) - 1
        while first > 0 and times[first] - times[first - 1] <= self.idle_gap:
            first -= 1
        span = times[-1] - times[first] if times else 0.0
        return (len(times) - 1 - first) / span if span > 0 else 0.0
