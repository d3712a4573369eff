"""What one engine step schedules, decides and reports: each sequence's share of the step, what
verification made of its proposals, the KV pool's statistics, and the StepEvent observers receive.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from minillm.config import CacheKind
from minillm.sequence import Phase, Sequence, SequenceStatus


@dataclass
class ScheduledSeq:
    """One sequence's share of a step: compute `num_tokens` tokens from its first uncomputed one.
    `samples`: the step reaches the sequence's last token, so its logits give a new token.
    `num_proposals`: of those tokens, the speculative proposals to verify (the step then needs the
    logits of every position from the last sampled token on)."""
    seq: Sequence
    num_tokens: int
    phase: Phase
    samples: bool
    num_proposals: int = 0

    @property
    def num_logits(self) -> int:
        """Rows of logits the step needs for this sequence: the last, or every verified position."""
        return self.num_proposals + 1 if self.samples else 0


@dataclass
class KVStats:
    """The KV pool after a step. Fragmentation is the share of slots in used blocks that hold no
    token (a sequence's unfilled last block); cached blocks are held by no sequence but still
    findable by the prefix cache, and are taken back (evicted) when free ones run out."""
    kind: CacheKind
    total_blocks: int
    used_blocks: int
    cached_blocks: int
    free_blocks: int
    block_size: int
    bytes_per_block: int
    used_bytes: int
    fragmentation: float
    prefix_hit_rate: float
    prefix_collisions: int = 0    # names found in the cache whose tokens or parent differed (each a miss)
    blocks_per_request: dict[str, int] = field(default_factory=dict)
    block_owner: list[str | None] = field(default_factory=list)  # per block: request id, "shared", "cached" or None


@dataclass(frozen=True)
class ScheduledWork:
    """What a step did for one sample (a StepEvent's record of a ScheduledSeq)."""
    request_id: str
    index: int
    num_tokens: int
    phase: Phase


@dataclass(frozen=True)
class Verification:
    """What the target made of one sequence's proposals in a step."""
    request_id: str
    index: int
    proposed: tuple[int, ...]     # the proposals verified
    accepted: int                 # how many of them, from the first, the target kept
    token: int                    # the token the target added after them (a correction, or the bonus)


@dataclass
class Verdict:
    """What verification made of one step's proposals (nothing, without speculative decoding)."""
    accepted: list[int] | None = None       # per batch item: how many of its proposals the target kept
    tokens: dict[Sequence, list[int]] = field(default_factory=dict)  # what each verifying sequence emits
    records: list[Verification] = field(default_factory=list)


@dataclass(frozen=True)
class SequenceSnapshot:
    """One live sample as a step left it."""
    request_id: str
    index: int
    status: SequenceStatus
    num_prompt_tokens: int
    num_computed_tokens: int      # tokens whose K/V are in the cache
    num_cached_prompt_tokens: int  # of the prompt, supplied by the prefix cache
    num_output_tokens: int
    num_preemptions: int
    block_table: tuple[int, ...]  # the blocks holding its tokens, in order (empty: contiguous, or none held)
    arrival_time: float           # time.perf_counter() when the engine received it


@dataclass
class StepEvent:
    """What one engine step did, for observers (LLMEngine.subscribe): the work scheduled, what finished, the
    queues, the KV pool, a snapshot of every live sequence, preemptions, tokens emitted, speculative
    verifications and the seconds of each phase."""
    step: int
    start: float                  # time.perf_counter() when the step began
    duration: float               # seconds
    scheduled: list[ScheduledWork]
    finished: list[str]           # request ids whose last sample finished in this step
    waiting: int
    running: int
    kv: KVStats
    sequences: list[SequenceSnapshot] = field(default_factory=list)  # running (admission order), then waiting
    preempted: list[str] = field(default_factory=list)  # request ids preempted while scheduling this step
    num_preemptions: int = 0      # since the engine started
    output_tokens: int = 0        # tokens emitted in this step (output_tokens / duration = tokens/s)
    verifications: list[Verification] = field(default_factory=list)  # speculative decoding, per sequence
    timings: dict[str, float] = field(default_factory=dict)  # seconds per phase (LLMEngine.step)
