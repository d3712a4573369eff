"""What speculation buys, in theory (Leviathan et al. 2023).

With acceptance rate alpha (the chance a proposal survives verification, assumed independent of
position), k proposals per step yield (1 - alpha^(k+1)) / (1 - alpha) tokens per target forward:
the accepted prefix, plus the one token every verification adds. For a target distribution p and
a proposer's q, alpha = sum over tokens of min(p, q) = 1 - total variation distance(p, q).
"""
import torch


def expected_tokens_per_forward(alpha: float, k: int) -> float:
    """Tokens a step emits on average, for acceptance rate alpha in [0, 1] and k proposals."""
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    return k + 1.0 if alpha == 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


def acceptance_rate(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """alpha = sum_x min(p(x), q(x)) per row: [..., vocab] probabilities -> [...]."""
    return torch.minimum(p, q).sum(-1)
