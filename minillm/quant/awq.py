"""Activation-aware scaling before quantization (AWQ-style; Lin et al., 2023).

A few input channels of a matmul carry much larger activations than the rest, and the error of a
weight in such a channel is multiplied by them. Scaling a weight column up by s (and its input down
by s) changes nothing in full precision, x @ W.T = (x / s) @ (W * s).T, but the quantized weight
then spends more of its grid on the columns that matter. Per matrix:

    s = mean|x|^alpha, normalised,   alpha picked from a grid to minimise ||x @ Q(W * s).T / ... - x @ W.T||

with x the inputs seen on a few hundred tokens of calibration text (the train split, never the
held-out text the quality is measured on). The division by s is folded into whatever produces the
input, so no extra operation runs at inference: the RMSNorm weight before qkv_proj and gate_up_proj,
and the up_proj rows before down_proj (down's input is silu(gate) * up, linear in up).
o_proj is left alone: its input channels come from value heads shared by several query heads.
"""
import torch

from minillm.corpus import corpus_tokens, spread_rows
from minillm.layers.attention import PackedRows
from minillm.quant.codecs import dequantize_int4, quantize_int4, quantize_int4_minmax
from minillm.quant.quant_config import QuantConfig

GRID = 20  # alphas tried: 0, 1/GRID, ..., 1 - 1/GRID


@torch.no_grad()
def capture_inputs(model: torch.nn.Module, rows: torch.Tensor,
                   layers: tuple[int, ...]) -> dict[tuple[int, str], torch.Tensor]:
    """The inputs of qkv_proj, gate_up_proj and down_proj of each layer on rows [n, t]:
    (layer, name) -> [n * t, in]."""
    seen, hooks = {}, []
    for i in layers:
        layer = model.model.layers[i]
        for name, module in (("qkv", layer.self_attn.qkv_proj), ("gate_up", layer.mlp.gate_up_proj),
                             ("down", layer.mlp.down_proj)):
            hooks.append(module.register_forward_hook(
                lambda _m, args, _out, key=(i, name): seen.__setitem__(key, args[0].detach().clone())))
    try:
        b, t = rows.shape
        model(rows.reshape(-1), torch.arange(t).repeat(b), PackedRows(b, t))
    finally:
        for hook in hooks:
            hook.remove()
    return seen


def best_scale(x: torch.Tensor, weight: torch.Tensor, group_size: int,
               int4_range: str = "holds-zero") -> tuple[torch.Tensor, float, float]:
    """The column scale s for weight [out, in] given inputs x [n, in], quantized with int4_range's
    codec; -> (s [in], its output error, the error with no scaling). s = 1 when no alpha beats it."""
    quantize = quantize_int4 if int4_range == "holds-zero" else quantize_int4_minmax
    w = weight.float()
    reference = x @ w.T
    magnitude = x.abs().mean(0).clamp_min(1e-6)                                   # [in]

    def error(s: torch.Tensor) -> float:
        scaled = dequantize_int4(*quantize(w * s, group_size)) / s
        return (x @ scaled.T - reference).pow(2).mean().item()

    plain = error(torch.ones_like(magnitude))
    best, best_error = torch.ones_like(magnitude), plain
    for step in range(1, GRID):
        s = magnitude.pow(step / GRID)
        s = s / (s.max() * s.min()).sqrt()  # centred around 1, so neither end of the range overflows
        e = error(s)
        if e < best_error:
            best, best_error = s, e
    return best, best_error, plain


@torch.no_grad()
def apply_awq(model: torch.nn.Module, config: QuantConfig, rows: torch.Tensor) -> dict:
    """Rescale model in place (still full precision, same function) so that quantizing it as config
    says loses less; -> the output error of each scaled matrix before and after, for a report."""
    if config.scheme != "int4":
        raise ValueError(f"activation-aware scaling is for int4 here, not {config.scheme!r}")
    layers = config.layer_indices(len(model.model.layers))
    inputs = capture_inputs(model, rows, layers)
    report = {}
    for i in layers:
        layer, picked = model.model.layers[i], set(config.projections)
        targets = [("qkv", layer.self_attn.qkv_proj, {"q_proj", "k_proj", "v_proj"}),
                   ("gate_up", layer.mlp.gate_up_proj, {"gate_proj", "up_proj"}),
                   ("down", layer.mlp.down_proj, {"down_proj"})]
        for name, linear, parts in targets:
            if not parts & picked:
                continue
            s, after, before = best_scale(inputs[(i, name)], linear.weight, config.group_size, config.int4_range)
            linear.weight.mul_(s[None, :].to(linear.weight.dtype))
            if name == "qkv":
                layer.input_layernorm.weight.div_(s.to(linear.weight.dtype))
            elif name == "gate_up":
                layer.post_attention_layernorm.weight.div_(s.to(linear.weight.dtype))
            else:  # down's input is silu(gate) * up: dividing up's rows divides it
                up = layer.mlp.gate_up_proj.weight[layer.mlp.intermediate_size:]
                up.div_(s[:, None].to(up.dtype))
            report[f"layer {i} {name}"] = {"error_before": before, "error_after": after}
    return report


def calibration_rows(model_dir, tokens: int = 512, seq_len: int = 256) -> torch.Tensor:
    """[tokens // seq_len, seq_len] rows of the bundled corpus's train split in the model's tokens."""
    return spread_rows(corpus_tokens(str(model_dir), "train", texts=16), max(1, tokens // seq_len), seq_len)

