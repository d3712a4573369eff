"""RMSNorm: scale each vector by the inverse of its root-mean-square, then by a learned gain.

    y = x / sqrt(mean(x^2) + eps) * weight

Unlike LayerNorm there is no mean subtraction and no bias. The statistics are computed in
float32 even when the model runs in bfloat16, as Hugging Face's Llama does: squaring bf16 values
loses too much precision.
"""
import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [..., hidden] -> [..., hidden]"""
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)
