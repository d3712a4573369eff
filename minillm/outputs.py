"""What the engine hands back: finished requests, and the pieces of a stream."""
from dataclasses import dataclass, field


@dataclass
class Completion:
    """One sample of a request. metrics: queue_time, ttft, tpot, e2e (seconds), itl (list),
    output_tokens, cached_prompt_tokens."""
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None  # "stop" (EOS, stop token or string), "length" (max_tokens), "abort", "error"
    metrics: dict = field(default_factory=dict)
    logprobs: list[dict[int, float]] | None = None  # per output token, with SamplingParams(logprobs=k)
    error: str | None = None  # with finish_reason "error": which of its constraints left no token to draw
    fault: bool = False  # ... or how the engine failed on this sample alone (engine/isolation.py): not the client's


@dataclass
class RequestOutput:
    """A finished request: its prompt and its n samples (`outputs`). `text`, `token_ids`,
    `finish_reason` and `metrics` are those of the first sample, the only one when n = 1."""
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[Completion]

    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def finish_reason(self) -> str | None:
        return self.outputs[0].finish_reason

    @property
    def metrics(self) -> dict:
        return self.outputs[0].metrics


@dataclass
class StreamChunk:
    """What one engine step added to one sample of a request: new text (valid UTF-8, never part
    of a stop string) and new token ids. A sample's last chunk has `finished` set and carries
    its Completion in `output`; the request's very last chunk also carries the whole `request`."""
    request_id: str
    index: int
    text: str
    token_ids: list[int]
    finished: bool = False
    output: Completion | None = None
    request: RequestOutput | None = None
    logprobs: list[dict[int, float]] | None = None  # per token in token_ids, with SamplingParams(logprobs=k)
