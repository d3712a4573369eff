"""The scheduler decides, every step, which sequences run and how many tokens each computes.

Policies (EngineConfig.scheduler):
  * sequential — one request at a time: the baseline with no batching at all.
  * static     — admit up to max_num_seqs requests, run them together until the *last* one
                 finishes, only then admit more (request-level batching, as with padded batches).
  * continuous — iteration-level batching (Orca, Yu et al. 2022; vLLM): every step, running
                 sequences go first, then waiting ones join while the step's token budget
                 (max_num_batched_tokens) and max_num_seqs allow; finished ones leave at once.
With chunked prefill (Sarathi-Serve, Agrawal et al. 2024) a long prompt is split across steps so
its prefill shares each step with the running decodes instead of stalling them.
When the KV pool cannot grow a running sequence, the newest running sequence is preempted: its
blocks are freed and it goes back to the front of the queue, to be recomputed from its tokens.
"""
from collections import deque

from minillm.config import EngineConfig
from minillm.engine.runner import ScheduledSeq
from minillm.engine.sequence import Sequence, SequenceStatus


class Scheduler:
    def __init__(self, config: EngineConfig, cache_manager) -> None:
        self.policy = config.scheduler
        self.max_num_seqs = 1 if self.policy == "sequential" else config.max_num_seqs
        self.budget = config.max_num_batched_tokens
        self.chunked = config.enable_chunked_prefill and self.policy == "continuous"
        self.cache_manager = cache_manager
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in admission order: the newest is last
        self.num_preemptions = 0
        self.preempted_now: list[str] = []  # request ids preempted by the latest schedule()

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def start(self, seq: Sequence, now: float) -> None:
        seq.status = SequenceStatus.RUNNING
        if seq.metrics.first_scheduled_time is None:
            seq.metrics.first_scheduled_time = now
        self.running.append(seq)

    def schedule(self, now: float) -> list[ScheduledSeq]:
        self.preempted_now = []
        batch: list[ScheduledSeq] = []
        budget = self.budget
        for seq in list(self.running):
            if seq.status != SequenceStatus.RUNNING:
                continue  # preempted while making room for an older sequence this step
            n = len(seq) - seq.num_computed_tokens  # 1 to decode; the rest of the prompt to prefill
            if self.chunked:
                n = min(n, budget)
            if n == 0 or (n > budget and batch):
                continue  # no budget left this step; it keeps its blocks and waits
            if not self._reserve(seq, n):
                continue  # it was itself the newest, and was preempted
            batch.append(ScheduledSeq(seq, n))
            budget -= n
        if self.policy == "static":
            if self.running:
                return batch  # a static batch admits no one until it has drained
            budget = float("inf")  # and prefills all its prompts at once, like a padded batch
        while self.waiting and len(self.running) < self.max_num_seqs and budget > 0:
            seq = self.waiting[0]
            if not self.cache_manager.allocate(seq):
                break  # the pool is full: wait for blocks to come back
            n = len(seq) - seq.num_computed_tokens
            if self.chunked:
                n = min(n, budget)
            elif n > budget and batch:
                self.cache_manager.free(seq)
                break  # unchunked, the whole prompt must fit in one step's budget
            self.start(self.waiting.popleft(), now)
            batch.append(ScheduledSeq(seq, n))
            budget -= n
        return batch

    def _reserve(self, seq: Sequence, n: int) -> bool:
        """Room for n more tokens of seq, preempting the newest running sequences if need be.
        -> False if seq itself had to be preempted."""
        while not self.cache_manager.reserve(seq, n):
            victim = self.running[-1]
            self.preempt(victim)
            if victim is seq:
                return False
        return True

    def preempt(self, seq: Sequence) -> None:
        """Recompute-style preemption: drop the K/V, keep the tokens, requeue at the front."""
        self.running.remove(seq)
        self.cache_manager.free(seq)
        seq.num_computed_tokens = 0
        seq.num_registered_blocks = 0
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.preempted_now.append(seq.request_id)
        self.waiting.appendleft(seq)

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
