"""The MLP speculator: a small recurrent network on the target's last hidden state that guesses k
tokens one after another, each guess conditioned on the one before (Wertheimer et al. 2024, IBM's
"MLP speculator"; EAGLE, Li et al. 2024, does the same with an attention layer).

Medusa-style heads (heads.py) guess token t + 1 + i from h_t alone, blind to the tokens between.
Yet when the proposer runs, the token after h_t is already chosen (the target's own, emitted by the
last verification), and it is the best clue to the one after it. So one step of the speculator
takes a state s (at first h_t, the target's post-norm hidden state) and the embedding of the token
that follows it, and predicts the next state, read through the target's own LM head:

    s' = s + down(SiLU(up(RMSNorm([s ; embed(x)]))))        logits = lm_head(s')

and s', with the embedding of its own guess, makes the next step. Only the first `vocab` token ids
are ever proposed: byte-level BPE numbers its tokens in merge order, so the low ids are the
frequent ones (on SmolLM2's chat answers, 90% of the tokens lie below 8,192), and the LM head that
the speculator reads at every step shrinks by the vocabulary's ratio (49,152 -> 8,192 rows: 6x less
to stream). The target verifies with its whole vocabulary, so the output stays the target's.
`python -m minillm train speculator` fits one to a frozen target; it is saved beside the target as
spec_mlp.safetensors, with the fingerprint of the model it fits (fitted.py). The ones that
ship, for the real models the engine knows by name, are in minillm/assets/speculators/.
"""
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from minillm.layers.rmsnorm import RMSNorm
from minillm.sequence import Sequence
from minillm.speculative.fitted import fingerprint, load_fitted
from minillm.speculative.target import ProposerTarget
from minillm.speculative.verify import target_probs

SPECULATOR_FILE = "spec_mlp.safetensors"
BUNDLED = Path(__file__).resolve().parent.parent / "assets" / "speculators"


class MLPSpeculator(nn.Module):
    def __init__(self, hidden_size: int, inner_size: int, vocab: int) -> None:
        super().__init__()
        self.vocab = vocab  # proposals are token ids below it
        self.norm = RMSNorm(2 * hidden_size)
        self.up = nn.Linear(2 * hidden_size, inner_size)
        self.down = nn.Linear(inner_size, hidden_size)
        nn.init.zeros_(self.down.weight)  # start as the identity: s' = s
        nn.init.zeros_(self.down.bias)

    def step(self, state: torch.Tensor, embedded: torch.Tensor) -> torch.Tensor:
        """state: [..., hidden], embedded: [..., hidden] (the next token's embedding) -> the next state."""
        return state + self.down(F.silu(self.up(self.norm(torch.cat([state, embedded], dim=-1)))))

    def logits(self, state: torch.Tensor, lm_head: torch.Tensor) -> torch.Tensor:
        """state: [..., hidden], lm_head: the target's [vocab_size, hidden] -> [..., self.vocab] logits."""
        return F.linear(state, lm_head[:self.vocab])


def save_speculator(spec: MLPSpeculator, target: nn.Module, path: Path) -> None:
    meta = {"format": "pt", "inner_size": str(spec.up.out_features), "vocab": str(spec.vocab),
            "target": fingerprint(target)}
    # bfloat16: half the bytes, and a proposer's rounding can change only how often it is right
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in spec.state_dict().items()}, str(path), metadata=meta)


def load_speculator(path: Path, target: nn.Module) -> MLPSpeculator:
    """The speculator in `path`, checked against the target it is to propose for."""
    build = lambda meta: MLPSpeculator(target.config.hidden_size, int(meta["inner_size"]), int(meta["vocab"]))
    return load_fitted(path, target, build, "MLP speculator", "speculator")


def find_speculator(model_dir: Path, model: nn.Module | None = None) -> Path | None:
    """The speculator for the model in model_dir: its own spec_mlp.safetensors, else a bundled one
    trained for it (the same fingerprint; model: the loaded model, else read from model_dir for
    the check), else None."""
    if (model_dir / SPECULATOR_FILE).is_file():
        return model_dir / SPECULATOR_FILE
    bundled = sorted(BUNDLED.glob("*.safetensors")) if BUNDLED.is_dir() else []
    if not bundled:
        return None
    if model is None:
        from minillm.models.prepare import load_model  # only to read the fingerprint: the LM head's weights
        model = load_model(model_dir, torch.float32, torch.device("cpu"))
    want = fingerprint(model)
    for path in bundled:
        with safe_open(str(path), framework="pt") as f:
            if (f.metadata() or {}).get("target") == want:
                return path
    return None


class MLPProposer:
    """Proposes from the hidden state the target left after each sequence's last computed token and
    the token the target emitted after it (the sequence's last)."""

    def __init__(self, path: str | None, target: ProposerTarget) -> None:
        self.embed, self.lm_head = target.model.model.embed_tokens, target.model.lm_head
        found = Path(path) if path else find_speculator(target.model_dir, target.model)
        self.spec = load_speculator(found or target.model_dir / SPECULATOR_FILE, target.model)
        self.hidden: dict[int, torch.Tensor] = {}  # id(seq) -> [hidden]

    @torch.inference_mode()
    def propose(self, seqs: list[Sequence], limits: list[int]) -> None:
        ready = [(seq, k) for seq, k in zip(seqs, limits) if id(seq) in self.hidden]
        if not ready:
            return
        state = torch.stack([self.hidden[id(seq)] for seq, _ in ready])  # [B, hidden]
        tokens = torch.tensor([seq.token_ids[-1] for seq, _ in ready], device=state.device)  # [B]
        weight, vocab_size = self.lm_head.weight, self.lm_head.weight.shape[0]
        drawn, probs = [], []
        for _ in range(max(k for _, k in ready)):
            state = self.spec.step(state, self.embed(tokens))
            logits = self.spec.logits(state, weight).float()  # [B, spec.vocab]
            if all(seq.params.temperature == 0 for seq, _ in ready):
                tokens = logits.argmax(-1)
            else:
                tokens, q = self._sample(ready, F.pad(logits, (0, vocab_size - logits.shape[-1]), value=-torch.inf))
                probs.append(q)
            drawn.append(tokens)
        guesses = torch.stack(drawn, dim=1).tolist()  # [B, max k]
        for b, (seq, k) in enumerate(ready):
            seq.spec_tokens = guesses[b][:k]
            seq.spec_probs = torch.stack([q[b] for q in probs[:k]]) if probs and seq.params.temperature else None

    @staticmethod
    def _sample(ready: list[tuple[Sequence, int]], logits: torch.Tensor) -> tuple[torch.Tensor, list]:
        """One draw per sequence from its shaped distribution (greedy ones take their argmax):
        logits [B, vocab_size] -> tokens [B], and the [B, vocab_size] distributions drawn from."""
        tokens, q = logits.argmax(-1), torch.zeros_like(logits)
        for b, (seq, _) in enumerate(ready):
            p = seq.params
            if p.temperature:
                q[b] = target_probs(logits[b:b + 1], p.temperature, p.top_k, p.top_p)[0]
                tokens[b] = torch.multinomial(q[b], 1, generator=seq.generator)[0]
        return tokens, q

    def verified(self, seq: Sequence, accepted: int, hidden: torch.Tensor) -> None:
        self.hidden[id(seq)] = hidden

    def release(self, seq: Sequence) -> None:
        self.hidden.pop(id(seq), None)
