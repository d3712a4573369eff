"""How much a quantized model differs from the full-precision one, on held-out text.

    perplexity   exp(mean next-token NLL) of the quantized model on the held-out windows
    KL           mean over tokens of KL(p_full || p_quant), in nats: how far each next-token
                 distribution moved (0 when nothing changed; it sees changes perplexity averages away)
    top-1        the fraction of positions where both models rank the same token first

Every figure comes from the same held-out windows (the bundled corpus's held-out split, in the
model's own tokens), each window read from its start as a fresh prompt would be. The full model's
log-probabilities are computed once (`Reference`) and every candidate is compared against them.
"""
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from minillm.corpus import corpus_tokens, spread_rows
from minillm.layers.attention import PackedRows


@dataclass(frozen=True)
class Quality:
    perplexity: float
    kl: float           # nats per token, KL(full || quantized)
    top1: float         # agreement of the argmax with the full model's
    tokens: int         # positions scored
    kl_per_window: tuple[float, ...] = ()   # the KL of each window: its spread is the noise of `kl`
    nll_per_window: tuple[float, ...] = ()  # mean NLL of each window: the noise of perplexity

    def as_dict(self) -> dict:
        return asdict(self)


def heldout_windows(model_dir: Path, count: int = 16, seq_len: int = 256) -> torch.Tensor:
    """[count, seq_len + 1] token ids spread evenly over the held-out split (the same every run)."""
    return spread_rows(corpus_tokens(str(model_dir), "heldout"), count, seq_len + 1)


@torch.no_grad()
def log_probs(model: torch.nn.Module, rows: torch.Tensor, batch: int = 8) -> torch.Tensor:
    """Next-token log-probabilities of every position but the last: rows [n, t + 1] -> [n, t, vocab]."""
    out = []
    for chunk in rows.split(batch):
        b, t = chunk.shape[0], chunk.shape[1] - 1
        hidden = model(chunk[:, :-1].reshape(-1), torch.arange(t).repeat(b), PackedRows(b, t))
        out.append(F.log_softmax(model.compute_logits(hidden).float(), dim=-1).view(b, t, -1))
    return torch.cat(out)


class Reference:
    """The full-precision model's log-probabilities on the windows, to compare candidates with."""

    def __init__(self, model: torch.nn.Module, windows: torch.Tensor) -> None:
        self.windows = windows
        self.log_probs = log_probs(model, windows)  # [n, t, vocab]
        self.quality = self.compare_log_probs(self.log_probs)

    def compare(self, model: torch.nn.Module) -> Quality:
        """Perplexity, KL from the reference and top-1 agreement of `model` on the same windows."""
        return self.compare_log_probs(log_probs(model, self.windows))

    def compare_log_probs(self, candidate: torch.Tensor) -> Quality:
        targets = self.windows[:, 1:]                                                  # [n, t]
        nll = -candidate.gather(-1, targets[..., None])[..., 0].mean(1)                    # [n]
        kl = (self.log_probs.exp() * (self.log_probs - candidate)).sum(-1).clamp_min(0).mean(1)  # [n]
        top1 = (candidate.argmax(-1) == self.log_probs.argmax(-1)).float().mean().item()
        return Quality(perplexity=math.exp(nll.mean().item()), kl=kl.mean().item(), top1=top1,
                       tokens=targets.numel(), kl_per_window=tuple(kl.tolist()),
                       nll_per_window=tuple(nll.tolist()))
