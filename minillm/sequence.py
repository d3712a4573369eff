"""A request and its sequences as the engine keeps them: each sample's tokens, status, cache state and
timings, the request the input processor built, and a prompt one engine prefilled for another.

Every layer reads these (the cache keeps per-sequence state on a Sequence, the scheduler moves it between
queues), so this module imports nothing else of the package: the layers can then depend one way only
(docs/design.md).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    import torch

    from minillm.sampling import SamplingParams
    from minillm.tokenizer import IncrementalDetokenizer


class Label(str, Enum):
    """An enum whose members are also their string values: `Phase.DECODE == "decode"`, and
    f-strings print "decode" on every Python version."""

    def __str__(self) -> str:
        return self.value

    @classmethod
    def parse(cls, knob: str, value) -> Label:
        """The member whose value is `value` (or the member itself); a ValueError naming the knob, the
        value and the accepted ones otherwise."""
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"{knob} must be one of {', '.join(e.value for e in cls)}, got {value!r}") from None


class SequenceStatus(Label):
    WAITING = "waiting"    # queued, or preempted and waiting to be recomputed
    RUNNING = "running"
    FINISHED = "finished"


class Phase(Label):
    PREFILL = "prefill"    # computes prompt tokens (or recomputes a preempted sequence's tokens)
    DECODE = "decode"      # computes the one token sampled last step


class FinishReason(Label):
    STOP = "stop"          # an end-of-sequence token, a stop token or a stop string
    LENGTH = "length"      # max_tokens reached
    ABORT = "abort"        # the caller gave up on it
    ERROR = "error"        # its constraints left no token, or the engine failed on it alone (Sequence.error says)


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
    """One sample of one request as the engine sees it: its tokens, status, cache state, timings.

    The scheduler owns every change of `status` and `num_computed_tokens`; the cache layout owns
    `kv` (its per-sequence state: a block table, or a sequence's own tensors).
    """

    def __init__(self, request_id: str, prompt: str | None, prompt_token_ids: list[int],
                 params: SamplingParams, generator: torch.Generator,
                 detokenizer: IncrementalDetokenizer, eos_token_ids: tuple[int, ...], index: int = 0) -> None:
        self.request_id = request_id
        self.index = index  # which of the request's n samples this is
        self.prompt = prompt
        self.prompt_token_ids = list(prompt_token_ids)
        self.token_ids = list(prompt_token_ids)  # prompt + generated so far
        self.params = params
        self.generator = generator
        self.detokenizer = detokenizer
        self.stop_token_ids = set(params.stop_token_ids) | (set() if params.ignore_eos else set(eos_token_ids))
        self.status = SequenceStatus.WAITING
        self.num_computed_tokens = 0  # tokens whose K/V are in the cache
        self.num_cached_prompt_tokens = 0  # prompt tokens the prefix cache supplied when last admitted
        self.kv: Any = None  # the cache layout's state for this sequence (None while it holds no cache)
        self.output_text = ""
        self.emitted_chars = 0  # how much of output_text has been streamed to the caller
        self.stop_text_from = 0  # a stop string counts only if it ends past here (params.min_tokens holds it back)
        self.finish_reason: FinishReason | None = None
        self.error: str | None = None  # why it ended with FinishReason.ERROR
        self.fault = False  # that error is the engine's, raised on this request alone (engine/isolation.py)
        self.logprobs: list[dict[int, float]] | None = [] if params.logprobs is not None else None
        self.grammar: Any = None  # structured output: this sample's structured.grammar.GrammarState
        # Speculative decoding: this step's proposals (computed after the last token, then verified),
        # the distributions they were drawn from ([len, vocab]; None: proposed with certainty), and counts.
        self.spec_tokens: list[int] = []
        self.spec_probs: Any = None
        self.num_proposed = self.num_accepted = 0
        self.forks: list[Sequence] = []  # samples 1..n-1, forked from this one after its prefill
        self.num_preemptions = 0
        self.metrics = RequestMetrics(arrival_time=time.perf_counter())

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_tokens_to_compute(self) -> int:
        """Tokens to compute before it can sample again: the rest of its prompt, or 1 to decode
        (1 + the proposals, when speculating)."""
        return len(self.token_ids) + len(self.spec_tokens) - self.num_computed_tokens

    @property
    def is_decoding(self) -> bool:
        """Only the latest sampled token is left to compute (its K/V, and the logits after it)."""
        return self.num_computed_tokens == len(self.token_ids) - 1

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED

    def __len__(self) -> int:
        return len(self.token_ids)

    def __repr__(self) -> str:
        return (f"Sequence({self.request_id!r}.{self.index}, {self.status}, prompt={self.num_prompt_tokens}, "
                f"output={len(self.output_token_ids)}, computed={self.num_computed_tokens})")


@dataclass
class EngineRequest:
    """A request the input processor has validated and built, not yet queued (LLMEngine.enqueue
    queues it): its n samples, sample 0 first (the others join after the prompt's prefill)."""
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    samples: list[Sequence]


class PrefilledPrompt(NamedTuple):
    """A request whose prompt one engine computed, on its way to another that decodes it
    (engine.handoff.give -> engine.handoff.take: engine/prefill_handoff.py; disagg/handoff.py moves it
    between processes)."""
    prompt_ids: list[int]
    first_tokens: list[int]                        # per sample: the token sampled after the prompt
    kv: Any                                        # the prompt's K/V, as the caller's pack returned them
    generator_states: list[torch.Tensor | None]    # per sample: its generator after that draw (None: it stopped)
    arrival_time: float                            # time.perf_counter() (one clock for every process of a host)
    first_scheduled_time: float | None
