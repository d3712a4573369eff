"""The scheduler decides, every step, which sequences run and how many tokens each computes.

This is the `sequential` policy: one request at a time, first come first served — a whole prompt
in one prefill step (minus any prefix found in the cache), then one decode step per token for
each of its samples until they finish. It is the baseline that batching policies are measured
against.
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

    def start(self, seq: Sequence, now: float) -> None:
        seq.status = SequenceStatus.RUNNING
        seq.metrics.first_scheduled_time = now
        self.running.append(seq)

    def schedule(self, now: float) -> list[ScheduledSeq]:
        if not self.running and self.waiting and self.cache_manager.allocate(self.waiting[0]):
            self.start(self.waiting.popleft(), now)
        batch = []
        for seq in self.running:
            # Prefill computes every uncached prompt token; decode computes the one new token.
            n = len(seq) - seq.num_computed_tokens
            if not self.cache_manager.reserve(seq, n):
                # Requests are checked against the pool's size when added, and this policy runs
                # one at a time, so this means the accounting is broken, not that memory is short.
                raise RuntimeError(f"KV pool exhausted while running {seq} alone")
            batch.append(ScheduledSeq(seq, n))
        return batch

    def finish(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.FINISHED
        if seq in self.running:
            self.running.remove(seq)
        self.cache_manager.free(seq)

    def abort(self, request_id: str) -> list[Sequence]:
        """Finish every sample of the request now, freeing its blocks. -> the sequences aborted."""
        aborted = []
        for seq in list(self.waiting) + list(self.running):
            if seq.request_id == request_id:
                if seq in self.waiting:
                    self.waiting.remove(seq)
                seq.finish_reason = "abort"
                self.finish(seq)
                aborted.append(seq)
        return aborted
