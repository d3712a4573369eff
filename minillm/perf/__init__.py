"""Performance models: hardware profiles, the roofline, and measurements of this machine.

    from minillm.perf import PROFILES, decode_cost, predicted_time
    cost = decode_cost(model_config, batch=8, context=512, dtype="bfloat16")
    predicted_time(PROFILES["H100 SXM"], cost, "bfloat16")      # seconds per decode step
"""
from minillm.perf.hardware import PROFILES, HardwareProfile
from minillm.perf.machine import machine, measure_bandwidth, measure_engine, measure_flops, measure_machine
from minillm.perf.roofline import (
    OpCost,
    attainable_flops,
    bound,
    decode_cost,
    dtype_bytes,
    kv_bytes_per_token,
    param_count,
    predicted_time,
    prefill_cost,
)
from minillm.perf.shapes import MODEL_SHAPES, model_shape
from minillm.perf.timing import median_time

__all__ = ["PROFILES", "HardwareProfile", "machine", "measure_bandwidth", "measure_flops", "measure_machine",
           "median_time", "OpCost", "attainable_flops", "bound", "decode_cost", "dtype_bytes", "kv_bytes_per_token",
           "measure_engine", "param_count", "prefill_cost", "predicted_time", "MODEL_SHAPES", "model_shape"]
