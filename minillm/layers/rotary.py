"""Rotary position embeddings (RoPE, Su et al. 2021) in Hugging Face's "rotate-half" layout.

Each head vector of size d is split into two halves, x1 = x[:d/2] and x2 = x[d/2:]; dimension i of
the first half is paired with dimension i of the second half and the pair is rotated by the angle
position * theta^(-2i/d):

    out = x * cos + rotate_half(x) * sin,   rotate_half(x) = [-x2, x1]

(The original paper pairs adjacent dimensions 2i and 2i+1; checkpoints converted to Hugging Face
format have their q/k weights permuted so that rotate-half is the right pairing for them.)
Because a rotation by position p of q and by position s of k leaves q.k depending only on p - s,
attention sees relative positions, and a cached key never needs re-rotating.

Computed here as x * cos + roll(x, d/2) * [-sin, sin]: rolling by half a head gives [x2, x1], and
the sign moves into the table, so rotating takes three operator calls instead of six. Queries and
keys are rotated together, in one call, as one tensor of heads.
"""
import torch
from torch import nn

from minillm.layers import cpu_ops


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, max_positions: int, theta: float = 10000.0) -> None:
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"rotary embeddings need an even head_dim, got {head_dim}")
        self.theta, self.half = theta, head_dim // 2
        # Tables are buffers (not parameters) so .to(device) moves them; never saved in checkpoints.
        for name, table in zip(("cos", "sin", "sin_signed"), self._tables_for(max_positions)):
            self.register_buffer(name, table, persistent=False)
        self._last: tuple | None = None  # (positions, dtype, cos, sin) of the latest call

    def _tables_for(self, positions: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """cos, sin and sin with its first half negated: [positions, d] each, float32."""
        d = 2 * self.half
        if torch.get_default_device().type == "meta":  # a loader's build, which computes them again once they have
            return tuple(torch.empty(positions, d) for _ in range(3))  # memory (arange on meta imports torch._dynamo)
        inv_freq = self.theta ** (-torch.arange(0, d, 2, dtype=torch.float32) / d)
        angles = torch.outer(torch.arange(positions, dtype=torch.float32), inv_freq)  # [positions, d/2]
        cos, sin = angles.cos(), angles.sin()
        return torch.cat([cos, cos], dim=-1), torch.cat([sin, sin], dim=-1), torch.cat([-sin, sin], dim=-1)

    @torch.no_grad()
    def reset_tables(self) -> None:
        """Compute the tables again, in place (the loader builds the model on the meta device, where they hold
        nothing, then gives them memory)."""
        for table, values in zip((self.cos, self.sin, self.sin_signed), self._tables_for(self.cos.shape[0])):
            table.copy_(values)
        self._last = None

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """positions: [num_tokens]; x: [num_tokens, heads, d] (query and key heads alike) -> rotated x.
        On a CPU in float32 (inference), x is rotated in place, in one C++ call (cpu_ops.py)."""
        cos, sin_signed = self._tables(positions, x.dtype)  # [num_tokens, d] each
        if x.stride(1) == x.shape[2] and cpu_ops.applies(x):
            return cpu_ops.rotary_(x, cos, sin_signed)
        cos, sin_signed = cos[:, None], sin_signed[:, None]  # [num_tokens, 1, d]: every head alike
        return torch.addcmul(x * cos, x.roll(self.half, dims=-1), sin_signed)

    def _tables(self, positions: torch.Tensor, dtype: torch.dtype):
        # Every layer shares this module and receives the same positions tensor in a forward, so
        # the lookup is done once per forward, not once per layer (holding the tensor keeps its
        # identity from being reused by another). A compiled step looks the tables up in its graph:
        # a cache kept on the module would make torch.compile guard on it and recompile every step.
        if torch.compiler.is_compiling():
            return self._lookup(positions, dtype)
        last = self._last
        if last is None or last[0] is not positions or last[1] != dtype:
            last = self._last = (positions, dtype, *self._lookup(positions, dtype))
        return last[2], last[3]

    def _lookup(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin at positions: [num_tokens, d] each (index_select: a fraction of [] indexing's cost)."""
        return self.cos.index_select(0, positions).to(dtype), self.sin_signed.index_select(0, positions).to(dtype)
