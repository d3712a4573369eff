"""How a step decodes: the strategy the engine core calls around its forward, plain or speculative.

    before scheduling   decoding.propose(running)             proposals join the step as extra tokens
    after the forward   decoding.verify(batch, logits, rows)  which proposals the target keeps, and the
                                                              tokens each verifying sequence emits (the
                                                              core samples every other sequence's row)
    before appending    decoding.observe(emitted, hidden)     the hidden state after each sequence's
                                                              last emitted token (heads propose from it)

PlainDecoding proposes nothing, so it verifies and observes nothing: each sampling sequence draws
one token. speculative/speculator.Speculator is the other implementation. The core calls whichever
it holds, the same way, so its step reads the same with speculation on or off.
"""
from typing import Protocol

import torch

from minillm.sequence import Sequence
from minillm.step import ScheduledSeq, Verdict


class Decoding(Protocol):
    def propose(self, running: list[Sequence]) -> None:
        """Before the scheduler decides: give running sequences their proposals (seq.spec_tokens)."""

    def verify(self, batch: list[ScheduledSeq], logits: torch.Tensor, rows: list[int]) -> Verdict:
        """logits: [sum of num_logits, vocab] of the step; rows[i]: batch[i]'s first row."""

    def observe(self, emitted: list[tuple[Sequence, list[int], int]], hidden: torch.Tensor) -> None:
        """emitted: (sequence, the tokens it emits, its first row) of the step; hidden: [rows, hidden]."""


class PlainDecoding:
    """One token per sampling sequence and step, drawn from its last row of logits."""

    def propose(self, running: list[Sequence]) -> None:
        pass

    def verify(self, batch: list[ScheduledSeq], logits: torch.Tensor, rows: list[int]) -> Verdict:
        return Verdict()

    def observe(self, emitted: list[tuple[Sequence, list[int], int]], hidden: torch.Tensor) -> None:
        pass
