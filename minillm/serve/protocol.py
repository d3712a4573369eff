"""The request bodies of `/v1/completions` and `/v1/chat/completions`, validated, and their mapping
to the engine's SamplingParams.

Field names and ranges are OpenAI's (temperature in [0, 2], top_p in (0, 1], logprobs up to 20,
n >= 1); `top_k`, `ignore_eos`, `guided_regex` and `guided_grammar` are extensions with vLLM's names.
Types are strict (a string is not a number), and unknown fields are refused, so a misspelt option
fails loudly instead of being ignored.
"""
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from minillm.sampling import MAX_LOGPROBS, SamplingParams
from minillm.structured import StructuredOutput

MAX_N = 16  # samples per prompt: each is a sequence in the batch, so a cap keeps one request from filling it


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)


class JsonSchemaFormat(Strict):
    name: str
    schema_: dict = Field(alias="schema")  # `schema` itself would shadow a BaseModel attribute
    description: str | None = None
    strict: bool | None = None


class ResponseFormat(Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> "ResponseFormat":
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError("response_format.json_schema is required exactly when type is 'json_schema'")
        return self


class StreamOptions(Strict):
    include_usage: bool = False


class CommonRequest(Strict):
    """What both endpoints share."""
    model: str
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] = 1.0
    top_p: Annotated[float, Field(gt=0, le=1)] = 1.0
    top_k: Annotated[int, Field(ge=0)] = 0
    seed: int | None = None
    stop: str | list[str] | None = None
    n: Annotated[int, Field(ge=1, le=MAX_N)] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    response_format: ResponseFormat | None = None
    guided_regex: str | None = None
    guided_grammar: str | None = None
    ignore_eos: bool = False
    user: str | None = None  # OpenAI's end-user id: accepted, not used

    @property
    def include_usage(self) -> bool:
        return self.stream and self.stream_options is not None and self.stream_options.include_usage

    def structured(self) -> StructuredOutput | None:
        """The constraint asked for, if any; more than one (say json_schema and guided_regex) is refused."""
        fmt = self.response_format
        asked = {"json_schema": fmt.json_schema.schema_ if fmt and fmt.json_schema else None,
                 "json_object": bool(fmt and fmt.type == "json_object"),
                 "regex": self.guided_regex, "grammar": self.guided_grammar}
        if not any(v for v in asked.values()):
            return None
        return StructuredOutput(**asked)  # raises ValueError when more than one is given

    def sampling_params(self, max_tokens: int, logprobs: int | None) -> SamplingParams:
        return SamplingParams(max_tokens=max_tokens, temperature=self.temperature, top_p=self.top_p,
                              top_k=self.top_k, seed=self.seed, stop=self.stop, n=self.n, logprobs=logprobs,
                              ignore_eos=self.ignore_eos, structured=self.structured())


class CompletionRequest(CommonRequest):
    """`prompt`: text, several texts, token ids, or several lists of token ids (one request each).
    `max_tokens` defaults to 16 as in OpenAI's API."""
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    echo: Literal[False] = False

    @model_validator(mode="after")
    def _prompt_not_empty(self) -> "CompletionRequest":
        if not self.prompt:
            raise ValueError("prompt is empty: give text, a list of texts or token ids")
        return self

    def prompts(self) -> list[str | list[int]]:
        if isinstance(self.prompt, str) or isinstance(self.prompt[0], int):
            return [self.prompt]
        return list(self.prompt)


class ChatMessage(Strict):
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str
    name: str | None = None


class ChatRequest(CommonRequest):
    """`max_tokens` (or OpenAI's newer `max_completion_tokens`) defaults to the rest of the context.
    `logprobs` turns per-token log-probabilities on; `top_logprobs` (0-20) adds the likeliest."""
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS)] | None = None

    @model_validator(mode="after")
    def _top_needs_logprobs(self) -> "ChatRequest":
        if self.top_logprobs and not self.logprobs:
            raise ValueError(f"top_logprobs ({self.top_logprobs}) needs logprobs set to true")
        return self

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @property
    def engine_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None
