"""The engine's read-only view: what observers may read between steps (LLMEngine.view).

    engine.view.num_waiting, engine.view.kv_stats(), engine.view.sequences()

It composes the parts it reads, the scheduler's queues and the KV cache, and changes nothing: the
core (engine.py) keeps only what makes a step happen. The StepEvent an observer receives after
every step is built from these same reads.
"""
from minillm.cache.base import CacheManager
from minillm.engine.scheduler import Scheduler
from minillm.step import KVStats, SequenceSnapshot


class EngineView:
    """The queues, the preemptions and the KV pool now, read from the scheduler and the cache."""
    def __init__(self, scheduler: Scheduler, cache: CacheManager) -> None:
        self._scheduler, self._cache = scheduler, cache

    @property
    def num_waiting(self) -> int:
        return len(self._scheduler.waiting)

    @property
    def num_waiting_seqs(self) -> int:
        """Sequences queued: a waiting request's samples fork once it runs, so it counts n."""
        return sum(1 + len(s.forks) for s in self._scheduler.waiting)

    @property
    def num_running(self) -> int:
        return len(self._scheduler.running)

    @property
    def num_preemptions(self) -> int:
        return self._scheduler.num_preemptions

    @property
    def uses_cpu_decode_kernel(self) -> bool:
        """Whether decode rows attend through the C++ paged kernel (kernels/paged_decode_cpu.py) this run."""
        return bool(getattr(self._cache, "cpu_decode", False))

    def kv_stats(self) -> KVStats:
        """The KV pool now: blocks used, cached and free, bytes, fragmentation, prefix hits."""
        return self._cache.stats(self._scheduler.running)

    def sequences(self) -> list[SequenceSnapshot]:
        """Every live sample now: running ones in admission order, then the waiting queue."""
        return [SequenceSnapshot(
            request_id=s.request_id, index=s.index, status=s.status, num_prompt_tokens=s.num_prompt_tokens,
            num_computed_tokens=s.num_computed_tokens, num_cached_prompt_tokens=s.num_cached_prompt_tokens,
            num_output_tokens=len(s.token_ids) - s.num_prompt_tokens, num_preemptions=s.num_preemptions,
            block_table=tuple(self._cache.block_table(s)), arrival_time=s.metrics.arrival_time)
            for s in [*self._scheduler.running, *self._scheduler.waiting]]
