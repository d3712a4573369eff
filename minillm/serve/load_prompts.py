"""The prompts of a load test: seeded, with the prompt and output lengths asked for.

Two sources: windows of the bundled model's held-out corpus (Python source it never trained on,
so prefix caching finds nothing shared by chance), or synthetic code-like text (no corpus to
read, the same on every machine). Lengths are counted in the bundled tokenizer's tokens; a server
with another tokenizer counts the same text differently, which its usage figures then report.
"""
from dataclasses import dataclass

import numpy as np

from minillm.corpus import corpus_tokens
from minillm.models.registry import resolve_model_path
from minillm.tokenizer import Tokenizer

SOURCES = ("corpus", "synthetic")


@dataclass(frozen=True)
class WorkItem:
    prompt: str
    max_tokens: int


def lengths(n: int, mean: int, range_ratio: float, rng: np.random.Generator) -> list[int]:
    """n integers uniform in [mean * (1 - range_ratio), mean * (1 + range_ratio)], at least 1."""
    if not 0 <= range_ratio < 1:
        raise ValueError(f"range_ratio must be in [0, 1), got {range_ratio}")
    lo, hi = max(1, round(mean * (1 - range_ratio))), max(1, round(mean * (1 + range_ratio)))
    return rng.integers(lo, hi + 1, size=n).tolist()


def synthetic_ids(tokenizer: Tokenizer, length: int, rng: np.random.Generator) -> list[int]:
    """`length` tokens of code-like text: small Python functions with random names and constants."""
    parts = []
    while True:
        name, a, b = rng.integers(0, 1000, size=3)
        parts.append(f"def handler_{name}(value, limit={a}):\n    if value > limit:\n        return value - {b}\n"
                     f"    return value * {b}\n\n")
        ids = tokenizer.encode("".join(parts))
        if len(ids) >= length:
            return ids[:length]


def make_workload(n: int, seed: int = 0, prompt_len: int = 64, output_len: int = 32, range_ratio: float = 0.0,
                  source: str = "corpus", tokenizer_model: str = "tiny") -> list[WorkItem]:
    """n prompts of about prompt_len tokens, each asking for output_len tokens (both spread by
    range_ratio), the same for the same arguments. source: corpus | synthetic."""
    if source not in SOURCES:
        raise ValueError(f"source must be one of {', '.join(SOURCES)}, got {source!r}")
    rng = np.random.default_rng(seed)
    model_dir = resolve_model_path(tokenizer_model)
    tokenizer = Tokenizer(model_dir)
    prompt_lens = lengths(n, prompt_len, range_ratio, rng)
    output_lens = lengths(n, output_len, range_ratio, rng)
    if source == "corpus":
        ids = corpus_tokens(str(model_dir), "heldout")
        starts = rng.integers(0, len(ids) - max(prompt_lens), size=n).tolist()
        prompts = [ids[s:s + k].tolist() for s, k in zip(starts, prompt_lens)]
    else:
        prompts = [synthetic_ids(tokenizer, k, rng) for k in prompt_lens]
    return [WorkItem(tokenizer.decode(p), m) for p, m in zip(prompts, output_lens)]
