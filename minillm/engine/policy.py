"""Step policies: who runs this step, and how many tokens each computes.

Policies (EngineConfig.scheduler):
  * sequential — one request at a time: the baseline with no batching at all (continuous_step
                 with max_num_seqs = 1, unchunked).
  * static     — admit up to max_num_seqs requests, run them together until the *last* one
                 finishes, only then admit more (request-level batching, as with padded batches).
  * continuous — iteration-level batching (Orca, Yu et al. 2022; vLLM): every step, running
                 sequences go first, then waiting ones join while the step's token budget
                 (max_num_batched_tokens) and max_num_seqs allow; finished ones leave at once.
With chunked prefill (Sarathi-Serve, Agrawal et al. 2024) a long prompt is split across steps so
its prefill shares each step with the running decodes instead of stalling them.

A policy decides; the scheduler acts. Through `sched` a policy reads the queues (`running` in
admission order, the newest last; `waiting` first come first served) and calls
  sched.admit(seq)            move the front waiting sequence to running, with KV for its tokens
                              (prefix-cache hits count as computed); False: no room, nothing changed
                              (no KV room, or fewer than its n samples' seats left under max_num_seqs)
  sched.grow(seq, n)          KV room for n more tokens of a running sequence; False: no room
  sched.preempt(seq)          free its KV, back to the front of the queue, to be recomputed
  sched.make_room(seq, n)     grow, preempting the newest running sequences until it fits
and returns [(sequence, tokens to compute)]. Lab 04 builds these three functions; the engine runs
the learner's versions through `Components`.
"""
from collections import deque
from typing import Protocol

from minillm.sequence import Sequence


class SchedulerOps(Protocol):
    running: list[Sequence]
    waiting: deque[Sequence]

    def admit(self, seq: Sequence) -> bool: ...
    def grow(self, seq: Sequence, num_tokens: int) -> bool: ...
    def preempt(self, seq: Sequence) -> None: ...
    def make_room(self, seq: Sequence, num_tokens: int) -> bool: ...


def make_room(sched: SchedulerOps, seq: Sequence, num_tokens: int) -> bool:
    """KV room for num_tokens more tokens of seq, preempting the newest running sequences until it
    fits. -> False if seq itself had to go (it was the newest)."""
    while not sched.grow(seq, num_tokens):
        victim = sched.running[-1]  # the newest: it has done the least work, and FCFS is kept
        sched.preempt(victim)
        if victim is seq:
            return False
    return True


def continuous_step(sched: SchedulerOps, budget: int, max_num_seqs: int, chunked: bool) -> list[tuple[Sequence, int]]:
    """One step of continuous batching under a token budget (inclusive). Running sequences first,
    oldest first; then waiting ones join. Unchunked, a sequence that needs more than is left sits
    out (a running one) or stops admission (a waiting one), unless the batch is still empty."""
    batch, left = [], budget
    for seq in list(sched.running):
        if seq not in sched.running:
            continue  # preempted while making room for an older sequence this step
        n = min(seq.num_tokens_to_compute, left) if chunked else seq.num_tokens_to_compute
        if n == 0 or (n > left and batch):
            continue  # no budget left for it this step: it keeps its blocks and waits
        if not sched.make_room(seq, n):
            continue  # it was itself the newest, and was preempted
        batch.append((seq, n))
        left -= n
    while sched.waiting and len(sched.running) < max_num_seqs and left > 0:
        seq = sched.waiting[0]
        if not chunked and seq.num_tokens_to_compute > left and batch:
            break  # unchunked, the whole prompt must fit what is left; nobody jumps the queue
        if not sched.admit(seq):
            break  # the pool is full: wait for blocks to come back
        n = min(seq.num_tokens_to_compute, left) if chunked else seq.num_tokens_to_compute
        batch.append((seq, n))
        left -= n
    return batch


def static_step(sched: SchedulerOps, max_num_seqs: int) -> list[tuple[Sequence, int]]:
    """One step of static batching: while any sequence runs, each computes what it has left and
    no one joins; once all have finished, admit up to max_num_seqs and prefill them together."""
    if sched.running:
        batch = []
        for seq in list(sched.running):
            if seq in sched.running and sched.make_room(seq, seq.num_tokens_to_compute):
                batch.append((seq, seq.num_tokens_to_compute))
        return batch
    while sched.waiting and len(sched.running) < max_num_seqs and sched.admit(sched.waiting[0]):
        pass
    return [(seq, seq.num_tokens_to_compute) for seq in sched.running]
