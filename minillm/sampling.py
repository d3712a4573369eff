"""SamplingParams (what a request asks for) and the sampler (how the next token is chosen).

Order of operations, the same as Hugging Face and vLLM: first the request's own controls on the
logits (logit_bias, repetition/presence/frequency penalties, min_tokens: logits_processors.py), then
the grammar mask of structured output (engine/sampler.py), then divide the logits by the temperature,
keep the top-k logits, keep the smallest set of tokens whose probability reaches top-p (the token
that crosses the threshold is kept), renormalise, draw. Temperature 0 means greedy (argmax).
Each request draws from its own seeded torch.Generator, so its samples do not depend on which
other requests share its batch.
"""
from dataclasses import dataclass, field

import torch

from minillm.structured.output_spec import StructuredOutput

MAX_LOGPROBS = 20
# A temperature this close to 0 is greedy, as in vLLM: dividing logits by 1e-191 overflows them to inf.
GREEDY_BELOW = 1e-5
# The smallest top_p kept: a smaller one rounds to 0 in float32 and would drop every token. Under 1e-6 the
# nucleus is the top token alone either way (its probability is at least 1 / vocab, over 1e-6).
MIN_TOP_P = 1e-6
REPETITION_PENALTY_RANGE = (0.01, 100.0)  # outside it, dividing a logit by the penalty can overflow to inf


@dataclass
class SamplingParams:
    """How one request is sampled and when it stops; checked when built (ValueError naming the bad value).
    temperature 0 is greedy; top_k 0 and top_p 1.0 turn those filters off."""
    max_tokens: int = 64
    temperature: float = 1.0
    top_k: int = 0              # 0: no top-k filter
    top_p: float = 1.0          # 1.0: no nucleus filter
    seed: int | None = None     # None: drawn from the engine's seeded generator
    stop: list[str] | str | None = None   # stop strings; the output is cut before the first match
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    n: int = 1                  # samples of the prompt; they share its KV blocks. Sample i uses seed + i
    logprobs: int | None = None  # report each output token's log-probability and the `logprobs` likeliest (0-20)
    structured: StructuredOutput | None = None  # the output must match this JSON schema, regex or grammar
    # The controls on the logits (logits_processors.py holds the formulas and their order); the defaults do nothing.
    presence_penalty: float = 0.0      # [-2, 2]: subtracted from every token the output already holds
    frequency_penalty: float = 0.0     # [-2, 2]: subtracted once per occurrence in the output
    repetition_penalty: float = 1.0    # > 0: prompt and output tokens' logits divided (> 0) or multiplied (< 0) by it
    logit_bias: dict[int, float] | None = None  # {token id: bias in [-100, 100]} added to the logits
    min_tokens: int = 0                # EOS and stop_token_ids are held back until the output has this many

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids)
        if isinstance(self.logit_bias, dict):
            self.logit_bias = dict(self.logit_bias) or None  # {}: no bias, so no work
        bias = self.logit_bias if isinstance(self.logit_bias, dict) else {}
        if is_number(self.temperature) and 0 < self.temperature < GREEDY_BELOW:
            self.temperature = 0.0
        if is_number(self.top_p) and 0 < self.top_p < MIN_TOP_P:
            self.top_p = MIN_TOP_P
        checks = [
            (isinstance(self.n, int) and self.n >= 1, f"n must be an integer >= 1, got {self.n!r}"),
            (self.logprobs is None or (isinstance(self.logprobs, int) and 0 <= self.logprobs <= MAX_LOGPROBS),
             f"logprobs must be None or an integer from 0 to {MAX_LOGPROBS}, got {self.logprobs!r}"),
            (isinstance(self.max_tokens, int) and self.max_tokens >= 1,
             f"max_tokens must be an integer >= 1, got {self.max_tokens!r}"),
            (self.temperature >= 0, f"temperature must be >= 0 (0 is greedy), got {self.temperature}"),
            (isinstance(self.top_k, int) and self.top_k >= 0,
             f"top_k must be an integer >= 0 (0 disables it), got {self.top_k!r}"),
            (0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}"),
            (all(isinstance(s, str) and s for s in self.stop),
             f"stop strings must be non-empty strings, got {self.stop!r}"),
            (self.seed is None or isinstance(self.seed, int), f"seed must be an integer or None, got {self.seed!r}"),
            (self.structured is None or isinstance(self.structured, StructuredOutput),
             f"structured must be a minillm.structured.StructuredOutput or None, got {type(self.structured).__name__}"),
            *[(is_number(getattr(self, name)) and -2 <= getattr(self, name) <= 2,
               f"{name} must be a number from -2 to 2 (0 disables it), got {getattr(self, name)!r}")
              for name in ("presence_penalty", "frequency_penalty")],
            (is_number(self.repetition_penalty)
             and REPETITION_PENALTY_RANGE[0] <= self.repetition_penalty <= REPETITION_PENALTY_RANGE[1],
             f"repetition_penalty must be a number from {REPETITION_PENALTY_RANGE[0]} to {REPETITION_PENALTY_RANGE[1]} "
             f"(1 disables it), got {self.repetition_penalty!r}"),
            (self.logit_bias is None or isinstance(self.logit_bias, dict),
             f"logit_bias must be a dict {{token id: bias}} or None, got {type(self.logit_bias).__name__}"),
            (not (bad_ids := [t for t in bias if not is_token_id(t)]),
             f"logit_bias keys must be token ids (integers >= 0), got {bad_ids!r}"),
            (not (bad_values := {t: b for t, b in bias.items() if not (is_number(b) and -100 <= b <= 100)}),
             f"logit_bias values must be numbers from -100 to 100, got {bad_values!r}"),
            (isinstance(self.min_tokens, int) and isinstance(self.max_tokens, int)
             and 0 <= self.min_tokens <= self.max_tokens,
             f"min_tokens must be an integer from 0 to max_tokens ({self.max_tokens}), got {self.min_tokens!r}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def processes_logits(self) -> bool:
        """Whether any control of logits_processors.py applies: False keeps the sampler's work as it was."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
                    or self.logit_bias or self.min_tokens)


def is_number(x) -> bool:
    """A real number: not a bool (True would pass as 1), not NaN."""
    return isinstance(x, int | float) and not isinstance(x, bool) and x == x


def is_token_id(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep each row's k largest logits, -inf elsewhere (ties with the k-th all stay); k = 0 keeps all.
    logits: [rows, vocab] -> [rows, vocab]"""
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, k, dim=-1).values[:, -1:]  # [rows, 1]
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Keep each row's nucleus: its most likely tokens until their probability reaches p (the
    token that crosses p stays, so the first one always does); p = 1 keeps all.
    logits: [rows, vocab] -> [rows, vocab]"""
    if p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = sorted_logits.softmax(-1)
    before = probs.cumsum(-1) - probs  # mass strictly before each token
    drop = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, order, before >= p)
    return logits.masked_fill(drop, float("-inf"))


def sample(logits: torch.Tensor, temperature: float, top_k: int, top_p: float,
           generator: torch.Generator) -> torch.Tensor:
    """One token per row: argmax when temperature is 0, else a draw from the filtered distribution.
    logits: [rows, vocab] -> [rows] int64"""
    if temperature == 0:
        return logits.argmax(-1)
    z = top_p_filter(top_k_filter(logits.float() / temperature, top_k), top_p)
    return torch.multinomial(z.softmax(-1), 1, generator=generator).squeeze(-1)


def sample_requests(logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator],
                    sample_fn=None, on_error=None) -> list[int | None]:
    """logits: [rows, vocab], one row per sequence with its own params and generator -> a token
    per row. Greedy rows share one argmax; a replaced sampler (sample_fn) gets every row.
    on_error(i, exception): row i's draw raised; its token is None and the other rows draw as they
    would have (each from its own generator). Without on_error, the exception propagates."""
    if sample_fn is None:
        greedy, sample_fn = logits.argmax(-1).tolist(), sample
    else:
        greedy = [None] * len(params)
    out = []
    for i, (p, gen) in enumerate(zip(params, generators)):
        if p.greedy and greedy[i] is not None:
            out.append(greedy[i])
            continue
        try:
            out.append(int(sample_fn(logits[i:i + 1], p.temperature, p.top_k, p.top_p, gen)[0]))
        except Exception as e:
            if on_error is None:
                raise
            on_error(i, e)
            out.append(None)
    return out


def token_logprobs(logits: torch.Tensor, token: int, top: int) -> dict[int, float]:
    """Log-probabilities under the model's own distribution (before the logits processors, the
    temperature and the filters) of the sampled token and of the `top` likeliest tokens, as vLLM's
    default (raw) logprobs. logits: [vocab] -> {token id: logprob}."""
    logprobs = logits.float().log_softmax(-1)
    best = logprobs.topk(top) if top else None
    out = {} if best is None else dict(zip(best.indices.tolist(), best.values.tolist()))
    out[token] = float(logprobs[token])
    return out
