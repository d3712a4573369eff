"""The scheduler: the queues, and every change of a sequence's status and computed tokens.

Each step a policy (engine/policy.py) decides who runs and how many tokens each computes; it acts
only through the transitions below, so a sequence's state changes in one place. When the KV pool
cannot grow a running sequence, the policy preempts: the victim's blocks are freed and it goes
back to the front of the queue, to be recomputed from its tokens (recompute preemption).

A request with n samples runs as n sequences: its other samples join after its prompt's prefill
(they fork from its K/V), so admitting it takes n seats of max_num_seqs at once, not one.
"""
from collections import deque
from collections.abc import Callable

from minillm.cache.base import CacheManager
from minillm.config import Components, SchedulerConfig, SchedulerPolicy
from minillm.engine import policy
from minillm.sequence import FinishReason, Phase, Sequence, SequenceStatus
from minillm.step import ScheduledSeq


class Scheduler:
    """The waiting and running queues and every change of a sequence's status: schedule() asks the step
    policy who runs, advance() counts what the model computed, finish() and preempt() free blocks."""
    def __init__(self, config: SchedulerConfig, cache: CacheManager, parts: Components | None = None) -> None:
        """parts: step policies to run in place of engine/policy.py's (the labs' through it)."""
        parts = parts or Components()
        self.policy = config.policy
        self._continuous_step = parts.continuous_step or policy.continuous_step
        self._static_step = parts.static_step or policy.static_step
        self._make_room = parts.make_room or policy.make_room
        self.on_release: list = []  # callbacks(seq) when a sequence's cache is freed (finished, preempted)
        self.max_num_seqs = 1 if self.policy == SchedulerPolicy.SEQUENTIAL else config.max_num_seqs
        self.budget = config.max_num_batched_tokens
        self.chunked = config.enable_chunked_prefill and self.policy == SchedulerPolicy.CONTINUOUS
        self.cache = cache
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in admission order: the newest is last
        self.num_preemptions = 0
        self.preempted_now: list[str] = []  # request ids preempted by the latest schedule()
        self._now = 0.0
        self._deciding = self._continuous_step  # the policy function of the step being scheduled

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # -- the step ---------------------------------------------------------------------------
    def schedule(self, now: float) -> list[ScheduledSeq]:
        """Decide this step's work (the policy), and check the decision before anything runs."""
        self._now, self.preempted_now = now, []
        if self.policy == SchedulerPolicy.STATIC:
            self._deciding = self._static_step
            plan = self._static_step(self, self.max_num_seqs)
        else:
            self._deciding = self._continuous_step
            plan = self._continuous_step(self, self.budget, self.max_num_seqs, self.chunked)
        self._check(plan)
        return [self._scheduled(seq, n) for seq, n in plan]

    def _scheduled(self, seq: Sequence, n: int) -> ScheduledSeq:
        end, verified = seq.num_computed_tokens + n, len(seq.token_ids)
        return ScheduledSeq(seq, n, Phase.DECODE if seq.is_decoding else Phase.PREFILL, samples=end >= verified,
                            num_proposals=max(0, end - verified))

    def advance(self, batch: list[ScheduledSeq], accepted: list[int] | None = None) -> list[tuple[Sequence, int]]:
        """After the model ran the batch: its tokens are computed, except proposals the target
        rejected (accepted[i]: how many of batch[i]'s it kept; their K/V beyond is dropped).
        -> the sequences that emit tokens now, each with its index in the batch (a request's other
        samples start here, after its prompt's prefill, from the same logits)."""
        sampling = []
        for i, item in enumerate(batch):
            seq = item.seq
            rejected = item.num_proposals - (accepted[i] if accepted else 0)
            seq.num_computed_tokens += item.num_tokens - rejected
            seq.spec_tokens, seq.spec_probs = [], None  # verified now, or dropped unscheduled by a chunk
            if rejected:
                self.cache.trim(seq)
            self.cache.computed(seq)
            if item.samples:
                sampling.append((seq, i))
                sampling += [(child, i) for child in self._fork(seq)]
        return sampling

    # -- transitions (the policy calls these) ------------------------------------------------
    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def admit(self, seq: Sequence) -> bool:
        if seq.status != SequenceStatus.WAITING or seq not in self.waiting:
            raise RuntimeError(f"{self._who()} admitted {seq!r}, which is not waiting")
        if len(self.running) >= self.max_num_seqs:
            raise RuntimeError(f"{self._who()} admitted {seq!r} while {len(self.running)} sequences run "
                               f"(max_num_seqs = {self.max_num_seqs})")
        if not self._has_seats(seq) or not self._allocate(seq):
            return False
        self.waiting.remove(seq)
        self._start(seq, self._now)
        return True

    def grow(self, seq: Sequence, num_tokens: int) -> bool:
        if seq not in self.running:  # a policy that plans a preempted or finished sequence is named, not the cache
            raise RuntimeError(f"{self._who()} asked KV room for {seq!r}, which is not running")
        return self.cache.reserve(seq, num_tokens)

    def make_room(self, seq: Sequence, num_tokens: int) -> bool:
        return self._make_room(self, seq, num_tokens)

    def preempt(self, seq: Sequence) -> None:
        """Recompute-style preemption: drop the K/V, keep the tokens, requeue at the front."""
        if seq not in self.running:
            raise RuntimeError(f"{self._who()} preempted {seq!r}, which is not running")
        self.running.remove(seq)
        self._release(seq)
        seq.num_computed_tokens = 0
        seq.spec_tokens, seq.spec_probs = [], None
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.preempted_now.append(seq.request_id)
        self.waiting.appendleft(seq)

    def finish(self, seq: Sequence, reason: FinishReason) -> None:
        seq.status, seq.finish_reason = SequenceStatus.FINISHED, reason
        if seq in self.running:
            self.running.remove(seq)
        self._release(seq)

    def _release(self, seq: Sequence) -> None:
        """Its KV blocks go back to the pool, and whatever else holds state for it lets go (the
        speculative draft's own cache)."""
        self.cache.free(seq)
        for release in self.on_release:
            release(seq)

    def abort(self, request_id: str) -> list[Sequence]:
        """Finish every sample of the request now, freeing its blocks. -> the sequences aborted."""
        aborted = [s for s in list(self.waiting) + self.running if s.request_id == request_id]
        for seq in aborted:
            if seq in self.waiting:
                self.waiting.remove(seq)
            self.finish(seq, FinishReason.ABORT)
        return aborted

    def admit_prefilled(self, seq: Sequence, first_scheduled_time: float | None,
                        fill: Callable[[Sequence], None]) -> list[Sequence] | None:
        """Admit a request whose prompt another engine computed (disaggregated serving; seq: its
        sample 0, never queued here) by the rules a waiting one meets: no sequence waits ahead of it,
        max_num_seqs allows one more, the pool has blocks for its prompt. fill(seq) then writes the
        prompt's K/V into its blocks from seq.num_computed_tokens on (the prefix cache supplied the
        rest), and the prompt counts as computed. first_scheduled_time: when the other engine first
        scheduled it. -> its samples, in index order, each to append its first token; None: refused,
        nothing changed (offer it again later)."""
        if self.waiting or not self._has_seats(seq) or not self._allocate(seq):
            return None
        self._start(seq, first_scheduled_time)
        fill(seq)
        computed = ScheduledSeq(seq, seq.num_prompt_tokens - seq.num_computed_tokens, Phase.PREFILL, samples=True)
        return [s for s, _ in self.advance([computed])]

    def seats_taken(self) -> int:
        """Sequences running, and the samples still to fork from them (they join without asking)."""
        return sum(1 + len(s.forks) for s in self.running)

    def _has_seats(self, seq: Sequence) -> bool:
        """max_num_seqs leaves room for seq and every sample that will fork from it."""
        return self.seats_taken() + 1 + len(seq.forks) <= self.max_num_seqs

    def _allocate(self, seq: Sequence) -> bool:
        """KV for seq's tokens; prefix-cache hits count as computed. -> False: no room, nothing changed."""
        cached = self.cache.allocate(seq)
        if cached is None:
            return False
        seq.num_computed_tokens = seq.num_cached_prompt_tokens = cached
        return True

    def _start(self, seq: Sequence, scheduled_at: float | None) -> None:
        """seq runs from now on. Its first admission is when its request was first scheduled (the
        one place metrics.first_scheduled_time is written): a preempted sequence keeps that time."""
        seq.status = SequenceStatus.RUNNING
        if seq.metrics.first_scheduled_time is None:
            seq.metrics.first_scheduled_time = scheduled_at
        self.running.append(seq)

    def _fork(self, parent: Sequence) -> list[Sequence]:
        """The request's other samples start from the parent's K/V (shared where the layout can),
        scheduled when their request was."""
        children, parent.forks = parent.forks, []
        for child in children:
            self.cache.fork(parent, child)
            child.num_computed_tokens = parent.num_computed_tokens
            child.num_cached_prompt_tokens = parent.num_cached_prompt_tokens
            self._start(child, parent.metrics.first_scheduled_time)
        return children

    # -- checking a policy's decision --------------------------------------------------------
    def _check(self, plan: list[tuple[Sequence, int]]) -> None:
        """A step policy's plan must be runnable: distinct running sequences, each computing
        1 .. its uncomputed tokens with KV room for them, within the budget (a lone sequence may
        exceed it: unchunked, a prompt longer than the budget could otherwise never run)."""
        problems, seen = [], set()
        for seq, n in plan:
            if seq.status != SequenceStatus.RUNNING or id(seq) in seen:
                problems.append(f"{seq!r} is {'listed twice' if id(seq) in seen else 'not running'}")
            elif not isinstance(n, int) or not 1 <= n <= seq.num_tokens_to_compute:
                problems.append(f"{seq!r} was given {n!r} tokens; it has {seq.num_tokens_to_compute} to compute")
            elif not self.cache.holds(seq, seq.num_computed_tokens + n):
                problems.append(f"{seq!r} was given {n} tokens without KV room for them (grow or make_room first)")
            seen.add(id(seq))
        total = sum(n for _, n in plan)
        if self.policy != SchedulerPolicy.STATIC and total > self.budget and len(plan) > 1:
            problems.append(f"the step computes {total} tokens, over the budget of {self.budget}")
        if problems:
            raise RuntimeError(f"{self._who()} made a step that cannot run: " + "; ".join(problems))

    def _who(self) -> str:
        """The policy deciding now, for messages: a plugged part carries its own label."""
        return getattr(self._deciding, "label", f"the step policy {self._deciding.__name__}")
