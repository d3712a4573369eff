"""Model preparation, the one home of every model the engine runs (the target, and a draft): loaded, quantized, and
laid out for the kernels.

    load_model     a checkpoint (loader.py) laid out for the CPU kernels: each Linear's product chosen
                   (layers/linear.py cpu_paths), weights column by column where F.linear reads them, and in huge
                   pages with their panel copies where decode streams them (huge_pages.py)
    prepare_model  load_model's model, or one shared with other engines (copied before any change), quantized as
                   asked (its LM head apart where asked) with the given QuantOps, its new codes in huge pages too:
                   the target's (engine/model_setup.py) and the draft's (speculative/draft.py)

The product paths are chosen on the full-precision model, before quantization, so that a quantized model keeps
the choices its checkpoint's size made.
"""
import copy
from pathlib import Path

import torch
from torch import nn

from minillm.layers.linear import cpu_paths, streamed
from minillm.models.huge_pages import to_huge_pages
from minillm.models.loader import read_checkpoint
from minillm.quant.apply import copy_sharing_weights, quantize_lm_head, quantize_model
from minillm.quant.awq import apply_awq, calibration_rows
from minillm.quant.quant_config import QuantConfig
from minillm.quant.quantized_linear import QuantizedLinear, QuantOps


def load_model(model_dir: Path, dtype: torch.dtype, device: torch.device) -> nn.Module:
    """The model of model_dir's checkpoint on device in dtype, laid out for the kernels that run it."""
    model = read_checkpoint(model_dir, dtype, device)
    if torch.device(device).type == "cpu":
        if not cpu_paths(model):  # no C++ product: F.linear at one row, faster on column-major weights
            column_major(model)
        if streamed(model):
            to_huge_pages(model)  # decode streams every weight a token: 2 MiB pages, not 4 KiB (huge_pages.py)
    return model


def prepare_model(model_dir: Path, dtype: torch.dtype, device: torch.device, quantization: QuantConfig | None = None,
                  head_quantization: QuantConfig | None = None, ops: QuantOps | None = None,
                  model: nn.Module | None = None, shared: bool = False) -> nn.Module:
    """The model to run, quantized with ops in its layers (None: the reference QuantOps). quantization: its layers'
    (a checkpoint quantized already keeps its own, and takes ops); head_quantization: the LM head's apart (a self
    draft's). model: model_dir's weights loaded already by load_model (on device, in dtype), None loads them;
    shared: other engines run model too, so it is copied before any change, never changed under them."""
    model = load_model(model_dir, dtype, device) if model is None else model
    model = quantized(model, model_dir, quantization, head_quantization, ops or QuantOps(), shared)
    if (quantization or head_quantization) and torch.device(device).type == "cpu" and streamed(model):
        to_huge_pages(model)  # the quantized codes are new tensors: in huge pages too (4 KiB pages cost 45% more)
    return model


def quantized(model: nn.Module, model_dir: Path, quantization: QuantConfig | None,
              head_quantization: QuantConfig | None, ops: QuantOps, shared: bool) -> nn.Module:
    """model quantized as prepare_model says; a shared one copied first, and only where something changes."""
    already = getattr(model, "quant_config", None)
    if quantization is not None and already is not None:
        raise ValueError(f"the model is already quantized ({already.label()}): load its "
                         f"full-precision checkpoint to quantize it another way")
    new_ops = already is not None and ops != QuantOps()
    if quantization is None and head_quantization is None and not new_ops:
        return model
    awq = quantization is not None and quantization.calibration == "awq"
    if shared:  # AWQ scales weights in place: a copy of its own; quantizing replaces layers and keeps the rest shared
        model = copy.deepcopy(model) if awq else copy_sharing_weights(model)
    if awq:
        apply_awq(model, quantization, calibration_rows(model_dir))
    if quantization is not None:
        model = quantize_model(model, quantization, ops)
    elif new_ops:  # the checkpoint's quantized layers: only their ops change
        for layer in model.modules():
            if isinstance(layer, QuantizedLinear):
                layer.ops = ops
    if head_quantization is not None:
        model = quantize_lm_head(model, head_quantization, ops)
    return model


def column_major(model: nn.Module) -> None:
    """Store each linear layer's weight [out, in] column by column (its transpose contiguous), same shape
    and values, where the C++ matrix-vector product is not built. nn.Linear computes x @ weight.T, and on a CPU
    a product with 1-3 rows (decode at a small batch) is 25-30% faster when weight.T is the contiguous one.
    Measured on this project's 2-core CPU over tiny's 25 matrices: 4.6 -> 3.2 ms at one row. From 4 rows on, wide
    matrices lose: a 3072 x 576 product takes 1.9 ms against 1.0 row-major, SmolLM2's 49152 x 576 LM head 45 ms
    against 30 (one thread)."""
    for module in model.modules():
        if isinstance(module, nn.Linear):
            module.weight.data = module.weight.data.t().contiguous().t()
