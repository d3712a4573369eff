"""The Llama-family decoder (Llama, Qwen2, Mistral-style configs), built from minillm.layers.

    x = embed(ids)
    for each layer:  x = x + attn(norm1(x));  x = x + mlp(norm2(x))
    logits = lm_head(norm(x))

Written as vLLM writes it, each residual add is handed to the norm that follows it: a layer takes the
stream and its last sublayer's output, and returns its own, `h, x = norm(h, x)` doing x = x + h and
h = norm(x) at once (one pass over the row; on a CPU one C++ call, layers/cpu_ops.py).

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
from minillm.models.cpu_decode import cpu_decode
from minillm.models.model_config import ModelConfig


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, rotary: RotaryEmbedding) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(layer_idx, cfg.hidden_size, cfg.num_attention_heads,
                                   cfg.num_key_value_heads, cfg.head_dim, cfg.qkv_bias, rotary)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = SwiGLUMLP(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, positions: torch.Tensor, h: torch.Tensor, x: torch.Tensor | None,
                ctx: AttentionContext | None) -> tuple[torch.Tensor, torch.Tensor]:
        """h: the last sublayer's output, not yet added to the residual stream x (the first layer: the embeddings,
        and x None) -> (this layer's MLP output, the stream before it), both [num_tokens, hidden]."""
        if x is None:  # the first layer: the stream starts as the embeddings
            h, x = self.input_layernorm(h), h
        else:
            h, x = self.input_layernorm(h, x)  # x = x + h; h = norm(x)
        h, x = self.post_attention_layernorm(self.self_attn(positions, h, ctx), x)
        return self.mlp(h), x

    def __getstate__(self) -> dict:
        # copy.deepcopy and pickle go through here: the C++ decode layer's struct (cpu_decode.py) holds raw pointers,
        # which neither can copy, and a copy makes its own
        state = self.__dict__.copy()
        state.pop("_cpu_decode", None)
        return state


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        weight = torch.empty(cfg.vocab_size, cfg.hidden_size)
        if not weight.is_meta:  # nn.Embedding's own initial weights (a loader builds on the meta device, where
            nn.init.normal_(weight)  # normal_ would import torch._dynamo: 900 modules, 1.2-1.7 s a process)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size, _weight=weight)
        # One rotary table shared by every layer (it depends only on head_dim and position).
        rotary = RotaryEmbedding(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, rotary) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: AttentionContext | None) -> torch.Tensor:
        h, x = self.embed_tokens(input_ids), None  # [num_tokens, hidden]
        step = cpu_decode(self.layers, positions, h, ctx)  # a CPU decode step: a C++ call a layer (cpu_decode.py)
        for i, layer in enumerate(self.layers):
            h, x = layer(positions, h, x, ctx) if step is None else step.run(i, h, x)
        return self.norm(h, x)[0]


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
