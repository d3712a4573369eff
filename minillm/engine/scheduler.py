"""The scheduler decides, every step, which sequences run and how many tokens each computes.

This is the `sequential` policy: one request at a time, first come first served — a whole prompt
in one prefill step, then one decode step per token until it finishes. It is the baseline that
batching policies are measured against.
"""
from collections import deque

from minillm.engine.runner import ScheduledSeq
from minillm.engine.sequence import Sequence, SequenceStatus


class Scheduler:
    def __init__(self, cache_manager) -> None:
        self.cache_manager = cache_manager
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self, now: float) -> list[ScheduledSeq]:
        if not self.running and self.waiting:
            seq = self.waiting.popleft()
            self.cache_manager.allocate(seq)
            seq.status = SequenceStatus.RUNNING
            seq.metrics.first_scheduled_time = now
            self.running.append(seq)
        # Prefill computes every uncached token of the prompt; decode computes the one new token.
        return [ScheduledSeq(s, len(s) - s.num_computed_tokens) for s in self.running]

    def finish(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.FINISHED
        if seq in self.running:
            self.running.remove(seq)
        self.cache_manager.free(seq)

    def abort(self, request_id: str) -> Sequence | None:
        for seq in list(self.waiting) + self.running:
            if seq.request_id == request_id:
                if seq in self.waiting:
                    self.waiting.remove(seq)
                self.finish(seq)
                seq.finish_reason = "abort"
                return seq
        return None
