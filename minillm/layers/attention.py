"""Causal grouped-query attention, and the seam where a KV cache plugs in.

Grouped-query attention (GQA, Ainslie et al. 2023): `num_heads` query heads share `num_kv_heads`
key/value heads; query head h reads kv head h // (num_heads // num_kv_heads). Fewer kv heads means
a smaller KV cache, which is what decode is bound by.

The model never knows how K/V are stored. Its attention layers hand q, k, v to an
`AttentionContext` built by the runner for the step; each cache layout (contiguous per sequence,
paged blocks) provides its own context. With no context the layer does plain causal attention over
the tokens it was given: one whole sequence, no cache (`LLM.logits`, and the recompute baseline).
"""
import torch
import torch.nn.functional as F
from torch import nn

from minillm.layers.linear import Linear
from minillm.layers.rotary import RotaryEmbedding


class AttentionContext:
    """Per-step attention metadata: stores the step's k/v and attends over each sequence's cache."""

    def attend(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q: [num_tokens, heads, d]; k, v: [num_tokens, kv_heads, d] -> [num_tokens, heads, d]."""
        raise NotImplementedError

    def cpu_decode_rows(self) -> tuple | None:
        """Where every row of the step is one decode token attended by the paged pool's C++ kernel and the engine
        runs its decoder layers as one C++ call each (models/cpu_decode.py): (slot_mapping int64 [rows], block
        tables int32 [rows, width], context lengths int32 [rows], rows int32 [rows], the pool). Else None."""
        return None


class PackedRows(AttentionContext):
    """Training batches are [batch, seq_len] rows of equal length, flattened for the model."""

    def __init__(self, batch: int, seq_len: int) -> None:
        self.batch, self.seq_len = batch, seq_len

    def attend(self, layer_idx, q, k, v):
        b, t = self.batch, self.seq_len
        out = F.scaled_dot_product_attention(
            q.view(b, t, *q.shape[1:]).transpose(1, 2), k.view(b, t, *k.shape[1:]).transpose(1, 2),
            v.view(b, t, *v.shape[1:]).transpose(1, 2), is_causal=True, enable_gqa=True)
        return out.transpose(1, 2).reshape(q.shape)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Attention of the last q_len positions of a sequence over all kv_len positions of it.

    q: [q_len, heads, d]; k, v: [kv_len, kv_heads, d] with kv_len >= q_len -> [q_len, heads, d].
    Query i sits at absolute position kv_len - q_len + i and may see keys 0 .. that position.
    """
    q_len, heads, d = q.shape
    kv_len, kv_heads = k.shape[0], k.shape[1]
    if q_len == 1:
        return decode_attention(q, k[None], v[None])  # the one query as a batch of one sequence
    group = heads // kv_heads
    # [kv_heads, group, len, d]: the query heads that share a kv head side by side, and K/V expanded to
    # them as views (never copied). Four-dimensional inputs reach SDPA's fused CPU kernel; three-
    # dimensional ones with enable_gqa took a path several times slower.
    q4 = q.view(q_len, kv_heads, group, d).permute(1, 2, 0, 3)
    k4 = k.transpose(0, 1)[:, None].expand(kv_heads, group, kv_len, d)
    v4 = v.transpose(0, 1)[:, None].expand(kv_heads, group, kv_len, d)
    if q_len == kv_len:
        mask, causal = None, True  # a whole prompt: plain causal
    else:
        # Queries are the *last* q_len positions: the diagonal is offset by kv_len - q_len.
        # (is_causal=True would align it top-left, the classic bug with a cache.)
        q_pos = torch.arange(kv_len - q_len, kv_len, device=q.device)
        mask, causal = q_pos[:, None] >= torch.arange(kv_len, device=q.device)[None, :], False
    out = F.scaled_dot_product_attention(q4, k4, v4, attn_mask=mask, is_causal=causal)  # [kv_heads, group, q_len, d]
    return out.permute(2, 0, 1, 3).reshape(q_len, heads, d)


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     padding: torch.Tensor | None = None) -> torch.Tensor:
    """One query per sequence, over every key of that sequence (decode needs no causal mask).

    q: [B, heads, d]; k, v: [B, L, kv_heads, d]; padding: [B, L] bool, True where sequence b has
    no key at position l (shorter sequences padded to L), or None -> [B, heads, d].
    The query heads that share a kv head are handed to attention as that head's queries: q becomes
    [B, kv_heads, group, d], so K/V are read in place, never repeated per query head, and one fused
    scaled_dot_product_attention call does the rest (on a CPU, several times faster than the same
    formula written out, whose every small operator pays a fixed cost).
    """
    b, heads, d = q.shape
    kv_heads = k.shape[2]
    mask = None if padding is None else ~padding[:, None, None, :]  # [B, 1, 1, L]: True where a key exists
    out = F.scaled_dot_product_attention(q.view(b, kv_heads, heads // kv_heads, d), k.transpose(1, 2),
                                         v.transpose(1, 2), attn_mask=mask)  # [B, kv_heads, group, d]
    return out.reshape(b, heads, d)


class Attention(nn.Module):
    def __init__(self, layer_idx: int, hidden_size: int, num_heads: int, num_kv_heads: int,
                 head_dim: int, qkv_bias: bool, rotary: RotaryEmbedding) -> None:
        super().__init__()
        if num_heads % num_kv_heads:
            raise ValueError(f"num_attention_heads ({num_heads}) must be a multiple of "
                             f"num_key_value_heads ({num_kv_heads})")
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        # q, k and v projections fused into one matmul; the loader stacks the checkpoint's three.
        self.qkv_proj = Linear(hidden_size, (num_heads + 2 * num_kv_heads) * head_dim, bias=qkv_bias)
        self.o_proj = Linear(num_heads * head_dim, hidden_size, bias=False)
        self.rotary = rotary
        self.qk_v_widths = [(num_heads + num_kv_heads) * head_dim, num_kv_heads * head_dim]
        self.qk_heads = [num_heads, num_kv_heads]

    def forward(self, positions: torch.Tensor, x: torch.Tensor, ctx: AttentionContext | None) -> torch.Tensor:
        """positions: [num_tokens]; x: [num_tokens, hidden] -> [num_tokens, hidden]"""
        n, d, h = x.shape[0], self.head_dim, self.num_heads
        # split_with_sizes: the op under Tensor.split, without the 2 us of Python in front of it (twice a layer).
        # qk: [n, (heads + kv_heads) * d], v: [n, kv_heads * d]
        qk, v = self.qkv_proj(x).split_with_sizes(self.qk_v_widths, -1)
        # Query and key heads are rotated together, as one [num_tokens, heads + kv_heads, d] tensor.
        q, k = self.rotary(positions, qk.view(n, -1, d)).split_with_sizes(self.qk_heads, 1)  # [n, heads|kv_heads, d]
        v = v.view(n, self.num_kv_heads, d)
        out = causal_attention(q, k, v) if ctx is None else ctx.attend(self.layer_idx, q, k, v)
        return self.o_proj(out.reshape(n, h * d))
