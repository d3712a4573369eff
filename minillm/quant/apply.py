"""Quantize a loaded model in place, following a QuantConfig's per-layer policy.

minillm fuses q, k and v into one matrix (qkv_proj) and gate and up into another (gate_up_proj).
Every scheme here quantizes each output row on its own (int8 and fp8 scale per row, int4 groups run
along a row), so quantizing a fused matrix whole gives exactly the same numbers as quantizing its
parts apart. When a policy picks only some of the parts (q but not k and v), the fused matrix is
split into row blocks: a StackedLinear of quantized and full-precision pieces, same output.
"""
import copy

from torch import nn

from minillm.quant.quant_config import QuantConfig
from minillm.quant.quantized_linear import QuantizedLinear, QuantOps, StackedLinear


def fused_parts(layer: nn.Module) -> dict[str, list[tuple[str, int]]]:
    """For one decoder layer: its linear modules (by path) -> their Hugging Face parts and row counts."""
    attn, mlp = layer.self_attn, layer.mlp
    q_rows, kv_rows = attn.num_heads * attn.head_dim, attn.num_kv_heads * attn.head_dim
    return {
        "self_attn.qkv_proj": [("q_proj", q_rows), ("k_proj", kv_rows), ("v_proj", kv_rows)],
        "self_attn.o_proj": [("o_proj", attn.o_proj.out_features)],
        "mlp.gate_up_proj": [("gate_proj", mlp.intermediate_size), ("up_proj", mlp.intermediate_size)],
        "mlp.down_proj": [("down_proj", mlp.down_proj.out_features)],
    }


def copy_sharing_weights(model: nn.Module) -> nn.Module:
    """A copy of model's modules over the same weights, to quantize: quantize_model replaces modules and writes no
    weight, so quantizing the copy leaves model as it was, without first copying every weight it is about to
    drop (SmolLM2's 540 MB of float32, for 140 MB of int8). Each parameter of the copy is a new Parameter over the
    same data, so that moving the copy's tensors elsewhere (models/huge_pages.py reassigns .data) leaves model's
    where they are; a tied pair stays tied. Not for a change that writes weights in place (AWQ's scaling)."""
    memo = {id(p): nn.Parameter(p.data, requires_grad=p.requires_grad) for p in model.parameters()}
    memo |= {id(b): b for b in model.buffers()}
    return copy.deepcopy(model, memo)


def quantize_model(model: nn.Module, config: QuantConfig, ops: QuantOps | None = None,
                   empty: bool = False) -> nn.Module:
    """Replace the linear layers `config` picks with QuantizedLinear (in place); -> model.
    empty: build the quantized layers without quantizing (zeros), for a checkpoint to fill."""
    if not isinstance(config, QuantConfig):
        raise TypeError(f"quantization must be a minillm.quant.QuantConfig, got {type(config).__name__}")
    if getattr(model, "quant_config", None) is not None:
        raise ValueError(f"this model is already quantized ({model.quant_config.label()})")
    layers = model.model.layers
    for i in config.layer_indices(len(layers)):
        for path, parts in fused_parts(layers[i]).items():
            owner_path, name = path.split(".")
            owner = getattr(layers[i], owner_path)
            replacement = _quantized(getattr(owner, name), parts, config, ops, empty)
            if replacement is not None:
                setattr(owner, name, replacement)
    if "lm_head" in config.projections:
        quantize_lm_head(model, config, ops, empty)
    model.quant_config = config
    return model


def quantize_lm_head(model: nn.Module, config: QuantConfig, ops: QuantOps | None = None,
                     empty: bool = False) -> nn.Module:
    """Replace the LM head alone with a QuantizedLinear in config's scheme (in place); -> model. quantize_model calls
    it when config names lm_head; called after it, it gives a model's head another scheme than its layers (a
    self draft's int8 head beside int4 layers). A tied head shares the embedding's matrix: the quantized head gets
    its own codes, and the embedding (a lookup, not a matmul) stays in full precision."""
    if isinstance(model.lm_head, QuantizedLinear):
        raise ValueError("this model's LM head is already quantized")
    head = model.lm_head
    try:
        model.lm_head = _one(head.weight, head.bias, config, ops, empty)
    except ValueError as e:
        raise ValueError(f"cannot quantize lm_head ({head.in_features} inputs): {e}") from None
    return model


def _quantized(linear: nn.Linear, parts: list[tuple[str, int]], config: QuantConfig, ops, empty: bool):
    """linear quantized where config picks its parts; None when it picks none of them."""
    picked = [name in config.projections for name, _ in parts]
    if not any(picked):
        return None
    try:
        if all(picked):
            return _one(linear.weight, linear.bias, config, ops, empty)
        pieces, start = [], 0
        for (_, rows), pick in zip(parts, picked):
            weight = linear.weight[start:start + rows]
            bias = None if linear.bias is None else linear.bias[start:start + rows]
            start += rows
            if pick:
                pieces.append(_one(weight, bias, config, ops, empty))
            else:
                piece = nn.Linear(
                    weight.shape[1], rows, bias=bias is not None,
                    device=weight.device, dtype=weight.dtype)
                piece.weight = nn.Parameter(weight.detach().clone(), requires_grad=False)
                if bias is not None:
                    piece.bias = nn.Parameter(bias.detach().clone(), requires_grad=False)
                pieces.append(piece)
        return StackedLinear(pieces)
    except ValueError as e:
        names = "/".join(name for (name, _), pick in zip(parts, picked) if pick)
        raise ValueError(f"cannot quantize {names} ({linear.in_features} inputs): {e}") from None


def _one(weight, bias, config: QuantConfig, ops, empty: bool) -> QuantizedLinear:
    if empty:
        return QuantizedLinear(weight.shape[1], weight.shape[0], config.scheme, config.group_size,
                               bias is not None, weight.dtype, weight.device, ops, config.int4_range, config.kernel)
    return QuantizedLinear.from_weight(weight, bias, config.scheme, config.group_size, ops, config.int4_range,
                                       config.kernel)


def linear_weight_bytes(model: nn.Module) -> dict[str, int]:
    """Bytes of weights, as stored now: 'quantized' for the quantized matrices (codes, scales and zero
    points) beside 'quantized_fp32', the same matrices in float32; 'linear' for every matmul of the
    model (the decoder layers' projections and the LM head) beside 'linear_fp32'; 'total' adds the
    rest (embedding, norms), counting a tied matrix once."""
    stored = fp32 = quantized = quantized_fp32 = 0
    for module in model.modules():
        if isinstance(module, QuantizedLinear):
            quantized += module.weight_bytes()
            quantized_fp32 += module.in_features * module.out_features * 4
        elif isinstance(module, nn.Linear):
            stored += module.weight.numel() * module.weight.element_size()
            fp32 += module.weight.numel() * 4
    other = {id(p): p for name, p in model.named_parameters() if "proj" not in name and "lm_head" not in name}
    tied = getattr(model.lm_head, "weight", None)
    if tied is not None and id(tied) in other:
        other.pop(id(tied))  # counted with the LM head above
    rest = sum(p.numel() * p.element_size() for p in other.values())
    return {"quantized": quantized, "quantized_fp32": quantized_fp32, "linear": stored + quantized,
            "linear_fp32": fp32 + quantized_fp32, "total": stored + quantized + rest}
