"""Weight-only quantization: codecs (int8, int4 group-wise, fp8), the quantized linear layer, the
per-layer policy and quantized checkpoints. What quantization costs in quality, and which layers it hurts, is
measured above the engine, in minillm/experiments/."""
from minillm.quant.apply import linear_weight_bytes, quantize_model
from minillm.quant.checkpoint import load_quantized, save_quantized
from minillm.quant.quant_config import PROJECTIONS, SCHEMES, QuantConfig
from minillm.quant.quantized_linear import QuantizedLinear, QuantOps

__all__ = ["PROJECTIONS", "SCHEMES", "QuantConfig", "QuantOps", "QuantizedLinear", "linear_weight_bytes",
           "load_quantized", "quantize_model", "save_quantized"]
