"""A Sequence is one request as the engine sees it: tokens, status, cache, and timings."""
import time
from dataclasses import dataclass, field
from enum import Enum

import torch

from minillm.sampling import SamplingParams
from minillm.tokenizer import IncrementalDetokenizer


class SequenceStatus(Enum):
    WAITING = "waiting"    # queued, or preempted and waiting to be recomputed
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class RequestMetrics:
    """Timestamps (time.perf_counter seconds) and the serving metrics derived from them.

    Definitions follow vLLM's benchmark: TTFT = first token - arrival; TPOT = (E2E - TTFT) /
    (output tokens - 1); ITL = the gaps between consecutive tokens.
    """
    arrival_time: float
    first_scheduled_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    finished_time: float | None = None

    @property
    def queue_time(self) -> float | None:
        return None if self.first_scheduled_time is None else self.first_scheduled_time - self.arrival_time

    @property
    def ttft(self) -> float | None:
        return self.token_times[0] - self.arrival_time if self.token_times else None

    @property
    def itl(self) -> list[float]:
        return [b - a for a, b in zip(self.token_times, self.token_times[1:])]

    @property
    def tpot(self) -> float | None:
        n = len(self.token_times)
        return (self.token_times[-1] - self.token_times[0]) / (n - 1) if n > 1 else None

    @property
    def e2e(self) -> float | None:
        return None if self.finished_time is None else self.finished_time - self.arrival_time

    def as_dict(self) -> dict:
        return {"queue_time": self.queue_time, "ttft": self.ttft, "tpot": self.tpot,
                "e2e": self.e2e, "itl": self.itl, "output_tokens": len(self.token_times)}


class Sequence:
    def __init__(self, request_id: str, prompt: str | None, prompt_token_ids: list[int],
                 params: SamplingParams, generator: torch.Generator,
                 detokenizer: IncrementalDetokenizer, eos_token_ids: tuple[int, ...]) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = list(prompt_token_ids)
        self.token_ids = list(prompt_token_ids)  # prompt + generated so far
        self.params = params
        self.generator = generator
        self.detokenizer = detokenizer
        self.stop_token_ids = set(params.stop_token_ids) | (set() if params.ignore_eos else set(eos_token_ids))
        self.status = SequenceStatus.WAITING
        self.num_computed_tokens = 0  # tokens whose K/V are in the cache
        self.output_text = ""
        self.emitted_chars = 0  # how much of output_text has been streamed to the caller
        self.finish_reason: str | None = None
        self.kv_cache = None  # contiguous cache: this sequence's own tensors
        self.block_table: list[int] = []  # paged cache: the blocks holding this sequence's tokens
        self.num_cached_prompt_tokens = 0  # prompt tokens found in the prefix cache
        self.num_registered_blocks = 0  # leading blocks already named in the prefix cache
        self.index = 0  # which of the request's n samples this is
        self.forks: list["Sequence"] = []  # samples 1..n-1, forked from this one after its prefill
        self.num_preemptions = 0
        self.metrics = RequestMetrics(arrival_time=time.perf_counter())

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED

    def __len__(self) -> int:
        return len(self.token_ids)

    def __repr__(self) -> str:
        return (f"Sequence({self.request_id!r}, {self.status.value}, prompt={self.num_prompt_tokens}, "
                f"output={len(self.output_token_ids)})")
