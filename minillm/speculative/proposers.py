"""Building a proposer from the configuration, what it may know of its target, and prompt lookup
(the proposer with no state).

A proposer gets a ProposerTarget, never the engine: the target's model, tokenizer, device and
dtype, the size of its KV pool, and a way to run a model over a cache as the target's runner does
(the draft's forwards). So speculative/ depends on nothing of the engine, and the engine, which
builds the target, chooses the runner.
"""
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from minillm.cache.base import CacheManager
from minillm.config import Components, SpeculativeConfig
from minillm.speculative.ngram import propose_ngram
from minillm.state import ScheduledSeq, Sequence
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


class NgramProposer:
    """Proposes the tokens that followed the latest earlier occurrence of the last n tokens: free to
    compute, certain (no distribution), and good exactly when the output repeats its context."""

    def __init__(self, n: int, propose=propose_ngram) -> None:
        self.n, self._propose = n, propose

    def propose(self, seqs: list[Sequence], limits: list[int]) -> None:
        for seq, k in zip(seqs, limits):
            seq.spec_tokens, seq.spec_probs = list(self._propose(seq.token_ids, self.n, k))[:k], None

    def verified(self, seq: Sequence, accepted: int, hidden: torch.Tensor) -> None:
        pass

    def release(self, seq: Sequence) -> None:
        pass


def make_proposer(config: SpeculativeConfig, target: ProposerTarget, components: Components):
    if config.method == "ngram":
        return NgramProposer(config.ngram, components.propose_ngram or propose_ngram)
    if config.method == "draft":
        from minillm.speculative.draft import DraftProposer
        return DraftProposer(config.draft_model, target)
    from minillm.speculative.heads import HeadsProposer
    return HeadsProposer(config.heads, target, config.k)
