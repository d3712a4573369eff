"""The request bodies of `/v1/completions` and `/v1/chat/completions`, validated, and their mapping
to the engine's SamplingParams.

Field names and ranges are OpenAI's (temperature in [0, 2], top_p in (0, 1], logprobs up to 20,
n >= 1, penalties in [-2, 2], a 64-bit seed), and null stands for the default wherever OpenAI lets
it; `top_k`, `min_tokens`, `repetition_penalty`, `ignore_eos`, `guided_regex` and `guided_grammar`
are extensions with vLLM's names. Fields that ask for nothing this server does (`metadata`, `store`,
`user`, `service_tier`, tools with `tool_choice: "none"`) are accepted and change nothing; a value
that would need what it lacks (tool calls, `suffix`, `best_of` > n) is refused by name. Types are
strict (a string is not a number), and unknown fields are refused, so a misspelt option fails
loudly instead of being ignored.
"""
import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from minillm.sampling import MAX_LOGPROBS, SamplingParams
from minillm.serve.limits import MAX_JSON_DEPTH, json_depth_over
from minillm.serve.messages import ChatMessage
from minillm.serve.openapi import LOGIT_BIAS_SCHEMA, PROMPT_SCHEMA, STOP_SCHEMA, SUFFIX_SCHEMA, TOOL_CHOICE_SCHEMA
from minillm.structured import StructuredOutput

MAX_N = 16  # samples per prompt: each is a sequence in the batch, so a cap keeps one request from filling it
INT64 = Field(ge=-(2**63), le=2**63 - 1)
Penalty = Annotated[float, Field(ge=-2, le=2)]
# A token id as a JSON object key: ASCII digits only (str.isdigit takes "²", and int() reads "١٢" as 12)
TOKEN_ID = re.compile(r"[0-9]+")
# The penalties and their values that change nothing: passed to SamplingParams only when set otherwise.
NEUTRAL = {"presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0, "logit_bias": None,
           "min_tokens": 0}


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
    include_usage: bool | None = None
    continuous_usage_stats: bool | None = None  # vLLM's: usage (so far) in every chunk


def _unencodable(value, path: str = "the body") -> str | None:
    """The path of the first string that is not valid Unicode (a lone surrogate escape such as
    "\\ud800" parses as JSON but cannot be encoded, so no tokenizer can read it)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path
    elif isinstance(value, dict):
        return next((p for k, v in value.items() if (p := _unencodable(k, path) or _unencodable(v, _at(path, k)))),
                    None)
    elif isinstance(value, list):
        return next((p for i, v in enumerate(value) if (p := _unencodable(v, _at(path, i)))), None)
    return None


def _at(path: str, key) -> str:
    return str(key) if path == "the body" else f"{path}.{key}"


class CommonRequest(Strict):
    """What both endpoints share."""
    model: str
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    top_k: Annotated[int, Field(ge=-1)] | None = None  # 0 or vLLM's -1: no top-k filter
    seed: Annotated[int, INT64] | None = None
    stop: Annotated[str | list[str] | None, STOP_SCHEMA] = None
    n: Annotated[int, Field(ge=1, le=MAX_N)] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    response_format: ResponseFormat | None = None
    guided_regex: str | None = None
    guided_grammar: str | None = None
    ignore_eos: bool | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    # bounded away from 0: it divides positive logits, and a penalty of 5e-324 overflows them to inf
    repetition_penalty: Annotated[float, Field(ge=0.01, le=100)] | None = None
    logit_bias: Annotated[dict[str, Annotated[float, Field(ge=-100, le=100)]] | None,
                          LOGIT_BIAS_SCHEMA] = None  # token id -> bias
    min_tokens: Annotated[int, Field(ge=0)] | None = None
    user: str | None = None                       # OpenAI's end-user id: accepted, not used
    metadata: dict[str, str] | None = None        # for the caller's records: accepted, not used
    store: bool | None = None                     # nothing is stored either way
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None  # one tier here

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data):
        if json_depth_over(data):  # first: the checks below recurse once per level
            raise ValueError(f"the body nests arrays and objects more than {MAX_JSON_DEPTH} levels deep: this "
                             f"server accepts at most {MAX_JSON_DEPTH} (serve/limits.py)")
        where = _unencodable(data)
        if where is not None:
            raise ValueError(f"{where} holds a string that is not valid Unicode (a lone surrogate such as "
                             f"\\ud800): send UTF-8 text")
        return data

    @field_validator("logit_bias", mode="before")  # before the values': the keys' message comes first
    @classmethod
    def _token_ids(cls, bias):
        bad = [k for k in bias if not isinstance(k, str) or not TOKEN_ID.fullmatch(k)] if isinstance(bias, dict) else []
        if bad:
            raise ValueError(f"logit_bias keys must be token ids written as decimal strings of the ASCII digits 0-9 "
                             f"(such as \"50256\"), got {bad[:5]}")
        return bias

    @property
    def samples(self) -> int:
        return self.n or 1

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.continuous_usage_stats)

    def structured(self) -> StructuredOutput | None:
        """The constraint asked for, if any; more than one (say json_schema and guided_regex) is refused.
        An empty schema `{}` is a constraint too: any JSON value."""
        fmt = self.response_format
        asked = {"json_schema": fmt.json_schema.schema_ if fmt and fmt.json_schema else None,
                 "json_object": bool(fmt and fmt.type == "json_object"),
                 "regex": self.guided_regex, "grammar": self.guided_grammar}
        if all(v is None or v is False for v in asked.values()):
            return None
        return StructuredOutput(**asked)  # raises ValueError when more than one is given

    def penalties(self, vocab_size: int) -> dict:
        """The penalty fields set to something other than neutral, by SamplingParams' names (logit_bias
        keyed by int token ids, each checked against the vocabulary: ValueError)."""
        given = {name: getattr(self, name) for name in NEUTRAL}
        asked = {k: v for k, v in given.items() if v is not None and v != NEUTRAL[k] and v != {}}
        if "logit_bias" in asked:
            bias = {int(k): v for k, v in asked["logit_bias"].items()}
            if max(bias) >= vocab_size:
                raise ValueError(f"logit_bias names token {max(bias)}; token ids are 0 to {vocab_size - 1}")
            asked["logit_bias"] = bias
        return asked

    def sampling_params(self, max_tokens: int, logprobs: int | None, vocab_size: int) -> SamplingParams:
        return SamplingParams(max_tokens=max_tokens, temperature=1.0 if self.temperature is None else self.temperature,
                              top_p=1.0 if self.top_p is None else self.top_p,
                              top_k=max(self.top_k or 0, 0), seed=self.seed, stop=self.stop, n=self.samples,
                              logprobs=logprobs, ignore_eos=bool(self.ignore_eos), structured=self.structured(),
                              **self.penalties(vocab_size))


class CompletionRequest(CommonRequest):
    """`prompt`: text, several texts, token ids, or several lists of token ids (one request each).
    `max_tokens` defaults to 16 as in OpenAI's API; 0 generates nothing (with `echo`, the prompt is
    scored: its tokens and their log-probabilities come back). `echo` puts the prompt ahead of each
    completion."""
    prompt: Annotated[str | list[str] | list[int] | list[list[int]], PROMPT_SCHEMA]
    max_tokens: Annotated[int, Field(ge=0)] | None = None
    logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    echo: bool | None = None
    best_of: Annotated[int, Field(ge=1, le=MAX_N)] | None = None
    suffix: Annotated[str | None, SUFFIX_SCHEMA] = None

    @model_validator(mode="after")
    def _supported(self) -> "CompletionRequest":
        if not self.prompt:
            raise ValueError("prompt is empty: give text, a list of texts or token ids")
        if self.best_of is not None and self.best_of != self.samples:
            raise ValueError(f"best_of ({self.best_of}) must equal n ({self.samples}): this server returns every "
                             f"sample it draws, so it cannot keep the best {self.samples} of {self.best_of}")
        if self.suffix:
            raise ValueError("suffix (text after the completion, for fill-in-the-middle) is not supported: "
                             "send it empty or leave it out")
        return self

    def prompts(self) -> list[str | list[int]]:
        if isinstance(self.prompt, str) or isinstance(self.prompt[0], int):
            return [self.prompt]
        return list(self.prompt)


class ChatRequest(CommonRequest):
    """`max_tokens` (or OpenAI's newer `max_completion_tokens`) defaults to the rest of the context.
    `logprobs` turns per-token log-probabilities on; `top_logprobs` (0-20) adds the likeliest.
    Tools may be listed only with `tool_choice: "none"`: the model answers in text, never with a call."""
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    tools: list[dict] | None = None
    tool_choice: Annotated[Literal["none", "auto", "required"] | dict | None, TOOL_CHOICE_SCHEMA] = None
    parallel_tool_calls: bool | None = None

    @model_validator(mode="after")
    def _supported(self) -> "ChatRequest":
        if self.top_logprobs and not self.logprobs:
            raise ValueError(f"top_logprobs ({self.top_logprobs}) needs logprobs set to true")
        calls = self.tool_choice not in (None, "none", "auto") or (self.tools and self.tool_choice != "none")
        if calls:
            raise ValueError(f"tool calling is not supported (tool_choice {self.tool_choice!r} with "
                             f"{len(self.tools or [])} tools): list no tools, or send tool_choice 'none'")
        return self

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @property
    def engine_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def template_messages(self) -> list[dict]:
        """The conversation as the chat template reads it: roles and text."""
        return [m.for_template() for m in self.messages]
