"""Multi-token-prediction heads: small extra layers on the target's last hidden state that guess
the tokens 2, 3, ... k + 1 positions ahead, with no extra forward of any model.

The hidden state h after token t already drives the target's own prediction of t + 1 (through its
LM head). Head i turns h into a guess at t + 1 + i the way Medusa's heads do (Cai et al. 2024;
DeepSeek-V3's MTP and EAGLE's draft layer are richer versions): a residual block, h + SiLU(W_i h
+ b_i), read through the target's own LM head, so each head adds only hidden² + hidden
parameters. `python -m minillm train heads` fits them with the target frozen; they are saved
beside the target as spec_heads.safetensors, with the fingerprint of the model they fit (fitted.py).
"""
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn

from minillm.sequence import Sequence
from minillm.speculative.fitted import fingerprint, load_fitted
from minillm.speculative.target import ProposerTarget
from minillm.speculative.verify import target_probs

HEADS_FILE = "spec_heads.safetensors"


class SpecHeads(nn.Module):
    def __init__(self, hidden_size: int, num_heads: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(hidden_size, hidden_size) for _ in range(num_heads))
        for block in self.blocks:  # start as the identity: head i first guesses what the LM head does
            nn.init.zeros_(block.weight)
            nn.init.zeros_(block.bias)

    def forward(self, hidden: torch.Tensor, lm_head: nn.Module, k: int) -> torch.Tensor:
        """hidden: [B, hidden] -> logits [B, k, vocab] for the tokens 2 .. k + 1 ahead."""
        return head_logits(hidden, self.blocks, lm_head, k)


def head_logits(hidden: torch.Tensor, blocks: nn.ModuleList, lm_head: nn.Module, k: int) -> torch.Tensor:
    """hidden: [B, hidden] -> logits [B, k, vocab]: head i (of the first k) reads the same hidden state."""
    guesses = torch.stack([hidden + F.silu(block(hidden)) for block in blocks[:k]], dim=1)  # [B, k, hidden]
    return lm_head(guesses)  # one pass over the LM head's weights for all k heads, not k passes


def propose_heads(hidden: torch.Tensor, blocks: nn.ModuleList, lm_head: nn.Module, k: int) -> list[list[int]]:
    """Each sequence's greedy proposals: the first k heads' top tokens, in order (Components.propose_heads)."""
    if not 0 <= k <= len(blocks):
        raise ValueError(f"k = {k} proposals asked of {len(blocks)} heads; 0 <= k <= {len(blocks)}")
    if k == 0:
        return [[] for _ in range(len(hidden))]
    return head_logits(hidden, blocks, lm_head, k).argmax(-1).tolist()


def save_heads(heads: SpecHeads, target: nn.Module, path: Path) -> None:
    save_file({k: v.contiguous() for k, v in heads.state_dict().items()}, str(path),
              metadata={"format": "pt", "num_heads": str(len(heads.blocks)), "target": fingerprint(target)})


def load_heads(path: Path, target: nn.Module) -> SpecHeads:
    """Heads from `path`, checked against the target they are to propose for."""
    return load_fitted(path, target, lambda meta: SpecHeads(target.config.hidden_size, int(meta["num_heads"])),
                       "speculative heads", "heads")


class HeadsProposer:
    """Proposes from the hidden state the target left after each sequence's last computed token."""

    def __init__(self, path: str | None, target: ProposerTarget, k: int, propose=None) -> None:
        self.lm_head, self._propose = target.model.lm_head, propose  # propose: Components.propose_heads, or None
        self.heads = load_heads(Path(path) if path else target.model_dir / HEADS_FILE, target.model)
        if k > len(self.heads.blocks):
            raise ValueError(f"speculative k = {k}, but the heads predict only {len(self.heads.blocks)} tokens ahead")
        self.hidden: dict[int, torch.Tensor] = {}  # id(seq) -> [hidden]

    @torch.inference_mode()
    def propose(self, seqs: list[Sequence], limits: list[int]) -> None:
        ready = [(seq, k) for seq, k in zip(seqs, limits) if id(seq) in self.hidden]
        if not ready:
            return
        hidden = torch.stack([self.hidden[id(seq)] for seq, _ in ready])  # [B, hidden]
        if self._propose is not None:  # a component's top tokens: proposed with certainty, so verify takes q = None
            proposals = self._propose(hidden, self.heads.blocks, self.lm_head, max(k for _, k in ready))
            for (seq, k), tokens in zip(ready, proposals):
                seq.spec_tokens, seq.spec_probs = [int(t) for t in tokens][:k], None
            return
        logits = self.heads(hidden, self.lm_head, max(k for _, k in ready)).float()  # [B, k, vocab]
        for (seq, k), rows in zip(ready, logits):
            p = seq.params
            if p.temperature == 0:
                seq.spec_tokens, seq.spec_probs = rows[:k].argmax(-1).tolist(), None
            else:
                q = target_probs(rows[:k], p.temperature, p.top_k, p.top_p)  # [k, vocab]
                seq.spec_tokens = torch.multinomial(q, 1, generator=seq.generator).squeeze(-1).tolist()
                seq.spec_probs = q

    def verified(self, seq: Sequence, accepted: int, hidden: torch.Tensor) -> None:
        self.hidden[id(seq)] = hidden

    def release(self, seq: Sequence) -> None:
        self.hidden.pop(id(seq), None)
