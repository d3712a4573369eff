"""Admission control: take a request in, or turn it away with `429 Too Many Requests` and a
`Retry-After` that says when the queue will have room.

A server that queues everything looks healthy while every request's TTFT grows without bound;
refusing early keeps the admitted requests fast and tells clients to back off. The estimate:

    excess = num_waiting - max_waiting + 1        # queued requests ahead of room for this one
    Retry-After = max(1, ceil(excess / drain_rate))   seconds, drain_rate in requests/s

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
    """Requests finished per second over the last `window` seconds (or since the first, if sooner)."""

    def __init__(self, window: float = 30.0) -> None:
        self.window = window
        self.started = time.monotonic()
        self.times: deque[float] = deque()

    def record(self) -> None:
        self.times.append(time.monotonic())

    def rate(self) -> float:
        now = time.monotonic()
        while self.times and self.times[0] < now - self.window:
            self.times.popleft()
        # at least one second of history, so the first finished request does not read as a huge rate
        return len(self.times) / max(min(self.window, now - self.started), 1.0)
