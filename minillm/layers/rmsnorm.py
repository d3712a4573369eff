"""RMSNorm: scale each vector by the inverse of its root-mean-square, then by a learned gain.

    y = x / sqrt(mean(x^2) + eps) * weight

Unlike LayerNorm there is no mean subtraction and no bias. The statistics are computed in
float32 even when the model runs in bfloat16, as Hugging Face's Llama does: squaring bf16 values
loses too much precision. PyTorch's fused `rms_norm` computes the formula in one operator call
instead of seven; decode runs 2 x layers + 1 of them per token, so the calls add up. On a CPU in float32
(inference) one C++ call does the residual add and the norm together (cpu_ops.py).
"""
import torch
import torch.nn.functional as F
from torch import nn

from minillm.layers import cpu_ops


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size))

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """x: [..., hidden] -> [..., hidden]. With the residual stream (x's shape): the residual add before the
        norm, done here -> (norm(x + residual), x + residual). The decoder hands each sublayer's output and the
        stream to the next norm this way (vLLM's fused_add_rms_norm), so that on a CPU the add and the norm are
        one pass over the row (cpu_ops.py; there the sum is written into residual's own memory)."""
        weight = self._parameters["weight"]  # not self.weight: nn.Module's attribute lookup costs half a microsecond
        if x.ndim == 2 and weight.dtype == torch.float32 and cpu_ops.applies(x):
            return cpu_ops.rms_norm(x, weight, self.eps, residual)
        if residual is None:
            return self.normed(x)
        x = x + residual
        return self.normed(x), x

    def normed(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        # Lower precision: normalise in float32, round to x's dtype, then scale (Hugging Face's order).
        return self.weight * F.rms_norm(x.float(), self.weight.shape, eps=self.eps).to(x.dtype)
