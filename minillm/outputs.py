"""What the engine hands back: a finished request, and the pieces of a stream."""
from dataclasses import dataclass, field


@dataclass
class RequestOutput:
    """A finished request. metrics: queue_time, ttft, tpot, e2e (seconds), itl (list), output_tokens."""
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]
    finish_reason: str | None  # "stop" (EOS, stop token or string), "length" (max_tokens), "abort"
    metrics: dict = field(default_factory=dict)


@dataclass
class StreamChunk:
    """What one engine step added to one request: new text (valid UTF-8, never part of a stop
    string) and new token ids. The last chunk of a request has `finished` set and carries `output`."""
    request_id: str
    text: str
    token_ids: list[int]
    finished: bool = False
    output: RequestOutput | None = None
