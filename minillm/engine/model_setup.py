"""The engine's model: prepared (loaded or shared with other engines, quantized, laid out for the kernels:
models/prepare.py) with the QuantOps of the config's components, and split across ranks when
tensor_parallel_size > 1 (rank 0 is this process: tp/driver.py)."""
from dataclasses import fields
from pathlib import Path

import torch

from minillm.config import Components, EngineConfig
from minillm.models.prepare import prepare_model
from minillm.quant import QuantOps
from minillm.quant.quantized_linear import int4_linear_triton
from minillm.tp.driver import TensorParallelDriver


def setup_model(config: EngineConfig, model_dir: Path, model: torch.nn.Module | None = None) -> torch.nn.Module:
    """model: weights already loaded from config.model (on config's device and dtype) to share one
    copy between engines with different knobs (it is copied before any change); None loads them.
    -> the model the engine runs: quantized as configured, the tensor-parallel driver with TP > 1."""
    model = prepare_model(model_dir, config.torch_dtype, config.torch_device, config.quantization,
                          ops=quant_ops(config.components, config.kernels.attention_backend), model=model,
                          shared=model is not None)
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
