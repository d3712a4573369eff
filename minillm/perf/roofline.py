"""The roofline model of one forward step of a Llama-family decoder.

A step does F floating-point operations and moves B bytes between memory and the chip. On hardware
with peak P FLOP/s and bandwidth W bytes/s it takes at least max(F / P, B / W): the step is
memory-bound when its arithmetic intensity F / B is below the ridge P / W, compute-bound above
(Williams, Waterman & Patterson, "Roofline", CACM 2009).

What is counted: the linear layers (2 FLOPs per weight per token), attention's QK^T and PV
(2 FLOPs each per query head, head dim and attended position), reading every weight once per step,
and reading (decode) or writing (prefill) the KV cache. Norms, RoPE, softmax and activations are
left out: they are a few percent of the FLOPs and bytes of these models.
"""
from dataclasses import dataclass

from minillm.models.model_config import ModelConfig
from minillm.perf.hardware import HardwareProfile

BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "int8": 1}


@dataclass(frozen=True)
class OpCost:
    flops: float
    bytes: float
    tokens: int          # tokens the step produces (decode) or consumes (prefill)

    @property
    def intensity(self) -> float:
        """FLOP per byte moved."""
        return self.flops / self.bytes


def param_count(cfg: ModelConfig) -> int:
    """Weights of the linear layers, the LM head included (the embedding lookup reads a few rows only)."""
    h, q, kv = cfg.hidden_size, cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    per_layer = h * q + 2 * h * kv + q * h + 3 * h * cfg.intermediate_size
    return cfg.num_hidden_layers * per_layer + h * cfg.vocab_size


def kv_bytes_per_token(cfg: ModelConfig, dtype: str) -> int:
    """K and V of one token, all layers, in a dtype named by string."""
    return cfg.kv_bytes_per_token(dtype_bytes(dtype))


def _attention_flops(cfg: ModelConfig, positions: float) -> float:
    """QK^T and PV of one query over `positions` keys, all layers."""
    return 4 * cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim * positions


def decode_cost(cfg: ModelConfig, batch: int, context: int, dtype: str) -> OpCost:
    """One decode step: `batch` sequences each add one token after `context` cached ones."""
    _check(batch, context)
    flops = batch * (2 * param_count(cfg) + _attention_flops(cfg, context))
    moved = param_count(cfg) * dtype_bytes(dtype) + batch * context * kv_bytes_per_token(cfg, dtype)
    return OpCost(flops, moved, batch)


def prefill_cost(cfg: ModelConfig, batch: int, prompt_len: int, dtype: str) -> OpCost:
    """One prefill step: `batch` prompts of `prompt_len` tokens, causal attention, KV written."""
    _check(batch, prompt_len)
    attention = _attention_flops(cfg, (prompt_len + 1) / 2) * prompt_len  # query i sees i + 1 keys
    flops = batch * (2 * param_count(cfg) * prompt_len + attention)
    moved = param_count(cfg) * dtype_bytes(dtype) + batch * prompt_len * kv_bytes_per_token(cfg, dtype)
    return OpCost(flops, moved, batch * prompt_len)


def attainable_flops(hw: HardwareProfile, intensity: float, dtype: str) -> float:
    """The roof: min(peak, intensity x bandwidth)."""
    return min(hw.peak(dtype), intensity * hw.bandwidth)


def predicted_time(hw: HardwareProfile, cost: OpCost, dtype: str) -> float:
    """Seconds: the slower of computing and moving, as if each ran at its peak."""
    return max(cost.flops / hw.peak(dtype), cost.bytes / hw.bandwidth)


def bound(hw: HardwareProfile, cost: OpCost, dtype: str) -> str:
    return "compute" if cost.flops / hw.peak(dtype) >= cost.bytes / hw.bandwidth else "memory"


def dtype_bytes(dtype: str) -> int:
    if dtype not in BYTES:
        raise ValueError(f"dtype must be one of {', '.join(BYTES)}, got {dtype!r}")
    return BYTES[dtype]


def _check(batch: int, tokens: int) -> None:
    if batch < 1 or tokens < 1:
        raise ValueError(f"batch and context must be at least 1, got batch {batch} and context {tokens}")
