"""RMSNorm: scale each vector by the inverse of its root-mean-square, then by a learned gain.

    y = x / sqrt(mean(x^2) + eps) * weight

Unlike LayerNorm there is no mean subtraction and no bias. The statistics are computed in
float32 even when the model runs in bfloat16, as Hugging Face's Llama does: squaring bf16 values
loses too much precision. PyTorch's fused `rms_norm` computes the formula in one operator call
instead of seven; decode runs 2 x layers + 1 of them per token, so the calls add up.
"""
import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [..., hidden] -> [..., hidden]"""
        if x.dtype == torch.float32:
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        # Lower precision: normalise in float32, round to x's dtype, then scale (Hugging Face's order).
        return self.weight * F.rms_norm(x.float(), self.weight.shape, eps=self.eps).to(x.dtype)
