"""Building a proposer from the configuration (for a ProposerTarget: speculative/target.py), and
prompt lookup (the proposer with no state)."""

import torch

from minillm.config import Components, SpeculativeConfig
from minillm.sequence import Sequence
from minillm.speculative.draft import DraftProposer
from minillm.speculative.heads import HeadsProposer
from minillm.speculative.mlp_speculator import MLPProposer
from minillm.speculative.ngram import propose_ngram
from minillm.speculative.target import ProposerTarget


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
        return DraftProposer(config.draft_model, target, config.draft_quantization, config.draft_head_quantization)
    if config.method == "mlp":
        return MLPProposer(config.speculator, target)
    return HeadsProposer(config.heads, target, config.k, components.propose_heads)
