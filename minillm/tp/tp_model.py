"""Turn a loaded model into rank r's shard of it: tensor parallelism across N ranks.

Per decoder layer (Megatron-LM's split):

    attention  qkv_proj column-parallel by heads: rank r keeps num_heads/N query heads and
               num_kv_heads/N kv heads (the kv heads its query heads read, since GQA groups are
               contiguous), so attention runs on local heads with no communication;
               o_proj row-parallel: its input is those heads' outputs -> all-reduce #1
    MLP        gate_up_proj column-parallel (gate and up cut separately, so a rank's silu(gate)
               multiplies the matching slice of up); down_proj row-parallel -> all-reduce #2

The residual stream, norms, embedding and LM head stay whole on every rank: after each all-reduce
every rank holds the same hidden states. The embedding and LM head are replicated because the
bundled vocabularies are tiny (4096 x 256 floats); large models split them by vocabulary too
("vocab-parallel"), which costs a gather of the logits.

The shard is a fresh model built from the per-rank config (heads, kv heads and MLP width divided by
N), so its attention layers reshape with local head counts; its KV pool, built from the same
config, holds only the rank's kv heads.
"""
import dataclasses
import math

import torch
from torch import nn

from minillm.models.model_config import ModelConfig
from minillm.tp.parallel_linear import AllReduce, ColumnParallelLinear, RowParallelLinear

SPLIT_FIELDS = ("num_attention_heads", "num_key_value_heads", "intermediate_size")


def tp_sizes(cfg: ModelConfig) -> list[int]:
    """The tensor-parallel sizes this model splits into: those dividing its heads, kv heads and MLP width."""
    return [n for n in range(1, math.gcd(*(getattr(cfg, f) for f in SPLIT_FIELDS)) + 1)
            if all(getattr(cfg, f) % n == 0 for f in SPLIT_FIELDS)]


def tp_config(cfg: ModelConfig, world: int) -> ModelConfig:
    """The config one rank's shard has: heads, kv heads and MLP width divided by `world`
    (head_dim and hidden_size unchanged). Refuses a world size that does not divide them."""
    for name in SPLIT_FIELDS:
        value = getattr(cfg, name)
        if value % world:
            raise ValueError(f"tensor_parallel_size {world} does not divide the model's {name} ({value}): each "
                             f"rank holds 1/{world} of them. This model accepts tensor_parallel_size in "
                             f"{tp_sizes(cfg)}")
    return dataclasses.replace(cfg, **{name: getattr(cfg, name) // world for name in SPLIT_FIELDS})


def shard_model(model: nn.Module, rank: int, world: int, all_reduce: AllReduce) -> nn.Module:
    """-> rank's shard of `model` (a LlamaForCausalLM-style model; `model` itself is not changed,
    so a model shared with other engines stays whole). all_reduce: sums a tensor in place across
    the ranks (comm.AllReduceMeter in the engine, a stand-in in the tests)."""
    cfg = model.config
    local = tp_config(cfg, world)
    weight = model.lm_head.weight
    with torch.device(weight.device):
        shard = type(model)(local).to(weight.dtype)
    # Replicated parts: shared with the full model rather than copied (nothing writes weights).
    shard.model.embed_tokens, shard.model.norm = model.model.embed_tokens, model.model.norm
    shard.lm_head = model.lm_head
    qkv_parts = [cfg.num_attention_heads * cfg.head_dim] + [cfg.num_key_value_heads * cfg.head_dim] * 2
    for full, mine in zip(model.model.layers, shard.model.layers):
        mine.input_layernorm, mine.post_attention_layernorm = full.input_layernorm, full.post_attention_layernorm
        attn, mlp = full.self_attn, full.mlp
        mine.self_attn.qkv_proj = ColumnParallelLinear(attn.qkv_proj, rank, world, qkv_parts)
        mine.self_attn.o_proj = RowParallelLinear(attn.o_proj, rank, world, all_reduce)
        mine.mlp.gate_up_proj = ColumnParallelLinear(mlp.gate_up_proj, rank, world, [cfg.intermediate_size] * 2)
        mine.mlp.down_proj = RowParallelLinear(mlp.down_proj, rank, world, all_reduce)
    return shard.eval()
