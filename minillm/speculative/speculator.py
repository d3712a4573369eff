"""The Speculator: speculative decoding as the engine's decoding strategy (engine/decoding.py).

    step:  speculator.propose(running)       -> each decoding sequence gets up to k proposals (seq.spec_tokens)
           scheduler.schedule()              -> a speculating sequence computes 1 + its proposals this step
           runner.execute()                  -> the target's logits at every one of those positions
           speculator.verify(batch, ...)     -> how many each sequence keeps, and the token after them
           scheduler.advance(accepted)       -> rejected positions are not computed: their slots are dropped
           speculator.observe(emitted, ...)  -> the proposer sees the hidden state its next proposals follow

The request's logits controls (logit_bias, penalties, min_tokens) shape the target's distribution at
every verified position, each counting the proposals before it as output, exactly as plain decoding
would have had them there: greedy speculation then emits plain greedy decoding's tokens, and
sampling stays exact. Proposers draw from their own unprocessed distributions (q); verification
corrects for any q, so this costs acceptance, never correctness.

Every proposer implements the Proposer protocol below, so the engine does not care where guesses
come from: prompt lookup (ngram.py), a draft model (draft.py) or prediction heads (heads.py).
"""
from dataclasses import dataclass, field
from typing import Protocol

import torch

from minillm.config import Components, SpeculativeConfig
from minillm.logits_processors import history_of, process_logits
from minillm.sequence import Sequence
from minillm.speculative.verify import verify
from minillm.step import ScheduledSeq, Verdict, Verification


class Proposer(Protocol):
    def propose(self, seqs: list[Sequence], limits: list[int]) -> None:
        """Give each sequence up to limits[i] proposals (seq.spec_tokens, and seq.spec_probs: the
        [n, vocab] distributions they were drawn from, or None if proposed with certainty)."""

    def verified(self, seq: Sequence, accepted: int, hidden: torch.Tensor) -> None:
        """The target kept `accepted` of seq's proposals; hidden: its last hidden state, after the
        last computed token (the one the next proposals follow)."""

    def release(self, seq: Sequence) -> None:
        """seq is finished or preempted: drop whatever is kept for it."""


@dataclass
class SpecStats:
    """Counts over the engine's life: proposals verified, how many the target reached (it stops at
    the first rejection), how many it kept."""
    proposed: int = 0
    reached: int = 0             # proposals the target decided on: the accepted ones and the first rejected
    accepted: int = 0
    verifications: int = 0       # (sequence, step) pairs that verified proposals
    emitted: int = 0             # tokens those verifications produced (accepted + one each)
    by_position: list[int] = field(default_factory=list)  # accepted proposals at position 1, 2, ...

    @property
    def acceptance_rate(self) -> float:
        """alpha: the chance a proposal the target reaches is accepted (the theory's alpha)."""
        return self.accepted / self.reached if self.reached else 0.0

    @property
    def tokens_per_forward(self) -> float:
        """Tokens each verifying target forward produced for a sequence (1.0 without speculation)."""
        return self.emitted / self.verifications if self.verifications else 1.0


class Speculator:
    def __init__(self, config: SpeculativeConfig, proposer: Proposer, max_model_len: int,
                 components: Components) -> None:
        self.config, self.proposer, self.max_model_len = config, proposer, max_model_len
        self._verify = components.verify or verify
        self.stats = SpecStats()

    def propose(self, running: list[Sequence]) -> None:
        """Proposals for every running sequence that is decoding and has none yet, as many as k,
        the tokens it may still emit (verification adds one) and the context allow."""
        seqs, limits = [], []
        for seq in running:
            if seq.is_decoding and not seq.spec_tokens:
                left = min(seq.params.max_tokens - len(seq.output_token_ids), self.max_model_len - len(seq))
                if left > 1:
                    seqs.append(seq)
                    limits.append(min(self.config.k, left - 1))
        if seqs:
            self.proposer.propose(seqs, limits)

    def verify(self, batch: list[ScheduledSeq], logits: torch.Tensor, rows: list[int]) -> Verdict:
        """logits: the step's [rows, vocab] (rows[i]: batch[i]'s first) -> how many proposals each
        batch item keeps, the tokens each speculating sequence emits, the records."""
        verdict = Verdict(accepted=[0] * len(batch))
        for i, item in enumerate(batch):
            if not item.num_proposals:
                continue
            seq, n = item.seq, item.num_proposals
            proposals, q = seq.spec_tokens[:n], None if seq.spec_probs is None else seq.spec_probs[:n]
            p = seq.params
            target = logits[rows[i]:rows[i] + n + 1]  # [n + 1, vocab]: after each proposal's context, and one more
            if p.processes_logits:  # row j follows proposals[:j]: its penalties count them as output
                target = process_logits(target, [history_of(seq, proposals[:j]) for j in range(n + 1)])
            m, token = self._verify(target, proposals, q, p.temperature, p.top_k, p.top_p, seq.generator)
            verdict.accepted[i], verdict.tokens[seq] = m, proposals[:m] + [token]
            verdict.records.append(Verification(seq.request_id, seq.index, tuple(proposals), m, token))
            seq.num_proposed += n
            seq.num_accepted += m
            self._count(n, m)
        return verdict

    def observe(self, emitted: list[tuple[Sequence, list[int], int]], hidden: torch.Tensor) -> None:
        """Each emitting sequence's hidden state after its last kept token (the row of its last
        accepted proposal, or its only row when it sampled one token), where its next proposals start."""
        for seq, tokens, row in emitted:
            self.proposer.verified(seq, len(tokens) - 1, hidden[row + len(tokens) - 1])

    def _count(self, proposed: int, accepted: int) -> None:
        s = self.stats
        s.proposed, s.accepted, s.verifications, s.emitted = (s.proposed + proposed, s.accepted + accepted,
                                                              s.verifications + 1, s.emitted + accepted + 1)
        s.reached += min(accepted + 1, proposed)
        s.by_position += [0] * (proposed - len(s.by_position))
        for j in range(accepted):
            s.by_position[j] += 1
