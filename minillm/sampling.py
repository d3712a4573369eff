"""SamplingParams (what a request asks for) and the sampler (how the next token is chosen).

Order of operations, the same as Hugging Face and vLLM: divide the logits by the temperature,
keep the top-k logits, keep the smallest set of tokens whose probability reaches top-p (the token
that crosses the threshold is kept), renormalise, draw. Temperature 0 means greedy (argmax).
Each request draws from its own seeded torch.Generator, so its samples do not depend on which
other requests share its batch.
"""
from dataclasses import dataclass, field

import torch


@dataclass
class SamplingParams:
    max_tokens: int = 64
    temperature: float = 1.0
    top_k: int = 0              # 0: no top-k filter
    top_p: float = 1.0          # 1.0: no nucleus filter
    seed: int | None = None     # None: drawn from the engine's seeded generator
    stop: list[str] | str | None = None   # stop strings; the output is cut before the first match
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    n: int = 1                  # samples of the prompt; they share its KV blocks. Sample i uses seed + i

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids)
        checks = [
            (isinstance(self.n, int) and self.n >= 1, f"n must be an integer >= 1, got {self.n!r}"),
            (isinstance(self.max_tokens, int) and self.max_tokens >= 1, f"max_tokens must be an integer >= 1, got {self.max_tokens!r}"),
            (self.temperature >= 0, f"temperature must be >= 0 (0 is greedy), got {self.temperature}"),
            (isinstance(self.top_k, int) and self.top_k >= 0, f"top_k must be an integer >= 0 (0 disables it), got {self.top_k!r}"),
            (0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}"),
            (all(isinstance(s, str) and s for s in self.stop), f"stop strings must be non-empty strings, got {self.stop!r}"),
            (self.seed is None or isinstance(self.seed, int), f"seed must be an integer or None, got {self.seed!r}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def filter_logits(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """Apply temperature, top-k and top-p to one row of logits: [vocab] -> [vocab], -inf where cut."""
    logits = logits.float() / temperature
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = sorted_logits.softmax(-1)
        # Mass strictly before each token: a token is kept while that is below top_p, so the
        # token whose probability crosses the threshold stays in (and the first one always does).
        before = probs.cumsum(-1) - probs
        drop = torch.zeros_like(logits, dtype=torch.bool).scatter(0, order, before >= top_p)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample(logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator]) -> list[int]:
    """logits: [batch, vocab] (one row per sequence) -> one token id per row."""
    greedy = logits.argmax(-1).tolist()
    out = []
    for row, p, gen, best in zip(logits, params, generators, greedy):
        if p.greedy:
            out.append(best)
            continue
        probs = filter_logits(row, p.temperature, p.top_k, p.top_p).softmax(-1)
        out.append(int(torch.multinomial(probs, 1, generator=gen)))
    return out
