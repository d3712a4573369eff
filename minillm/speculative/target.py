"""What a proposer may know of its target: a ProposerTarget, never the engine.

The target's model, tokenizer, device and dtype, the size of its KV pool, and a way to run a model
over a cache as the target's runner does (the draft's forwards). So speculative/ depends on nothing
of the engine, and the engine, which builds the target, chooses the runner.
"""
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from minillm.cache.base import CacheManager
from minillm.step import ScheduledSeq
from minillm.tokenizer import Tokenizer


class Runner(Protocol):
    def execute(self, batch: list[ScheduledSeq]) -> torch.Tensor:
        """One forward over the batch -> logits [sum of num_logits, vocab], in batch order."""


@dataclass(frozen=True)
class ProposerTarget:
    """The model a proposer proposes for, as far as a proposer needs it."""
    model: torch.nn.Module            # the target (the heads read its LM head and fingerprint it)
    model_dir: Path                   # its files (trained heads are saved beside them)
    tokenizer: Tokenizer              # a draft must share it
    device: torch.device
    dtype: torch.dtype
    kv_slots: int                     # tokens the target's KV pool holds (a draft holds as many)
    make_runner: Callable[[torch.nn.Module, CacheManager], Runner]  # runs a model over its own cache
    cache: CacheManager | None = None  # the target's KV cache, read-only (a self draft starts from its K/V)
