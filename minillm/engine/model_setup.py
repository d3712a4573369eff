"""The engine's model: loaded (or shared with other engines), quantized as the config says, and
split across ranks when tensor_parallel_size > 1 (rank 0 is this process: tp/driver.py)."""
import copy
from dataclasses import fields
from pathlib import Path

import torch

from minillm.config import Components, EngineConfig
from minillm.layers.linear import streamed
from minillm.models.huge_pages import to_huge_pages
from minillm.models.loader import load_model
from minillm.quant import QuantizedLinear, QuantOps, quantize_model
from minillm.quant.apply import copy_sharing_weights
from minillm.quant.awq import apply_awq, calibration_rows
from minillm.quant.quantized_linear import int4_linear_triton
from minillm.tp.driver import TensorParallelDriver


def setup_model(config: EngineConfig, model_dir: Path, model: torch.nn.Module | None = None) -> torch.nn.Module:
    """model: weights already loaded from config.model (on config's device and dtype) to share one
    copy between engines with different knobs (it is copied before any change); None loads them.
    -> the model the engine runs: quantized as configured, the tensor-parallel driver with TP > 1."""
    shared = model is not None
    model = model if shared else load_model(model_dir, config.torch_dtype, config.torch_device)
    model = quantized(model, config, shared, model_dir)
    if config.quantization is not None and config.torch_device.type == "cpu" and streamed(model):
        to_huge_pages(model)  # the quantized codes are new tensors: in huge pages too, as the loader's were
    if config.parallel.tensor_parallel_size > 1:  # the workers run the other shards
        model = TensorParallelDriver(model, model_dir, config)
    return model


def quant_ops(components: Components, attention_backend: str) -> QuantOps:
    """The codecs and int4 product quantized layers use: the components' where a lab replaces them,
    else the engine's (int4 on the fused Triton kernel with the Triton backend)."""
    parts = {f.name: getattr(components, f.name) for f in fields(QuantOps) if getattr(components, f.name)}
    if attention_backend == "triton":
        parts.setdefault("int4_linear", int4_linear_triton)
    return QuantOps(**parts)


def quantized(model: torch.nn.Module, config: EngineConfig, shared: bool, model_dir: Path) -> torch.nn.Module:
    """model with quantized layers that use config's QuantOps: quantized as config.quantization says
    when it is set, or already quantized by its checkpoint. A model shared with other engines is
    copied before any change, never changed under them."""
    ops, already = quant_ops(config.components, config.kernels.attention_backend), getattr(model, "quant_config", None)
    if config.quantization is None:
        if already is None or ops == QuantOps():
            return model
        model = copy_sharing_weights(model) if shared else model  # only the layers' ops change
        for layer in model.modules():
            if isinstance(layer, QuantizedLinear):
                layer.ops = ops
        return model
    if already is not None:
        raise ValueError(f"the model is already quantized ({already.label()}): load its "
                         f"full-precision checkpoint to quantize it another way")
    if config.quantization.calibration == "awq":  # scales weights in place: on a copy of its own
        model = copy.deepcopy(model) if shared else model
        apply_awq(model, config.quantization, calibration_rows(model_dir))
    elif shared:  # quantizing replaces layers: the copy shares the weights it keeps instead of copying them all
        model = copy_sharing_weights(model)
    return quantize_model(model, config.quantization, ops)
