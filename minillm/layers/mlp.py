"""The SwiGLU feed-forward block (Shazeer 2020): down( silu(gate(x)) * up(x) ).

gate and up are fused into one matrix so a token makes one matmul instead of two: on a CPU or a
GPU at small batch every matmul launch costs time, and decode is made of small matmuls.
"""
import torch
import torch.nn.functional as F
from torch import nn

from minillm.layers import cpu_ops
from minillm.layers.linear import Linear


class SwiGLUMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.intermediate_size = intermediate_size
        self.gate_up_proj = Linear(hidden_size, 2 * intermediate_size, bias=False)
        self.down_proj = Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [num_tokens, hidden] -> [num_tokens, hidden]"""
        gate_up = self.gate_up_proj(x)  # [num_tokens, 2 * intermediate]
        if gate_up.dim() == 2 and cpu_ops.applies(gate_up):  # a CPU in float32: one C++ call (cpu_ops.py)
            return self.down_proj(cpu_ops.silu_mul(gate_up))
        gate, up = gate_up.split(self.intermediate_size, dim=-1)
        return self.down_proj(F.silu(gate) * up)
