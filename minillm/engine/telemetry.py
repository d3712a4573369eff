"""Telemetry: one typed event per engine step, for the visualizer, benchmarks and labs.

Observers subscribe with `engine.subscribe(callback)`. With no observer nothing is computed: the
statistics below cost a pass over the running sequences' block tables.
"""
from dataclasses import dataclass, field


@dataclass
class KVStats:
    """The KV pool after a step. Fragmentation is the share of slots in used blocks that hold no
    token (a sequence's unfilled last block); cached blocks are unreferenced but still findable
    by the prefix cache, and are taken back (evicted) when free ones run out."""
    kind: str                     # "paged" or "contiguous"
    total_blocks: int
    used_blocks: int
    cached_blocks: int
    free_blocks: int
    block_size: int
    bytes_per_block: int
    used_bytes: int
    fragmentation: float
    prefix_hit_rate: float
    blocks_per_request: dict[str, int] = field(default_factory=dict)
    block_owner: list[str | None] = field(default_factory=list)  # per block: request id, "shared", "cached" or None


@dataclass
class ScheduledWork:
    request_id: str
    index: int
    num_tokens: int
    phase: str                    # "prefill" or "decode"


@dataclass
class StepEvent:
    step: int
    start: float                  # time.perf_counter() when the step began
    duration: float               # seconds
    scheduled: list[ScheduledWork]
    finished: list[str]           # request ids whose last sample finished in this step
    waiting: int
    running: int
    kv: KVStats
    preempted: list[str] = field(default_factory=list)  # request ids preempted while scheduling this step
    num_preemptions: int = 0      # since the engine started
    output_tokens: int = 0        # tokens sampled in this step (output_tokens / duration = tokens/s)
