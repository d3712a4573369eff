"""The Llama-family decoder (Llama, Qwen2, Mistral-style configs), built from minillm.layers.

    x = embed(ids)
    for each layer:  x = x + attn(norm1(x));  x = x + mlp(norm2(x))
    logits = lm_head(norm(x))

Tokens arrive flattened: `input_ids` and `positions` are [num_tokens], possibly from several
sequences at once; how they group into sequences is the AttentionContext's business.
Module names mirror Hugging Face's, so checkpoint names map one to one (except the fused qkv and
gate_up projections, which the loader stacks).
"""
import torch
from torch import nn

from minillm.layers.attention import Attention, AttentionContext
from minillm.layers.linear import Linear
from minillm.layers.mlp import SwiGLUMLP
from minillm.layers.rmsnorm import RMSNorm
from minillm.layers.rotary import RotaryEmbedding
from minillm.models.config import ModelConfig


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, rotary: RotaryEmbedding) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(layer_idx, cfg.hidden_size, cfg.num_attention_heads,
                                   cfg.num_key_value_heads, cfg.head_dim, cfg.qkv_bias, rotary)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = SwiGLUMLP(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, positions: torch.Tensor, x: torch.Tensor, ctx: AttentionContext | None) -> torch.Tensor:
        x = x + self.self_attn(positions, self.input_layernorm(x), ctx)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        # One rotary table shared by every layer (it depends only on head_dim and position).
        rotary = RotaryEmbedding(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, rotary) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: AttentionContext | None) -> torch.Tensor:
        x = self.embed_tokens(input_ids)  # [num_tokens, hidden]
        for layer in self.layers:
            x = layer(positions, x, ctx)
        return self.norm(x)


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = LlamaModel(cfg)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                ctx: AttentionContext | None = None) -> torch.Tensor:
        """input_ids, positions: [num_tokens] -> hidden states [num_tokens, hidden]."""
        return self.model(input_ids, positions, ctx)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [n, hidden] -> logits [n, vocab]. Kept apart from forward so the runner projects
        only the rows it samples from (the last token of each sequence), not the whole prompt."""
        return self.lm_head(hidden)
