"""The fused CPU path of QuantizedLinear: int8 and int4 matmuls that read the stored codes and never
build the float weight (fused_matvec.cpp), for the few rows of x a decode step has.

Decode at batch 1 reads every weight once per token, so its time is the weight bytes over the
memory bandwidth: 1 byte a weight (int8) or half of one plus the scales (int4) instead of float32's
4 pays only if nothing writes a float32 copy on the way. The reference (linear.py) rebuilds the
float weight in every forward and multiplies with it; these kernels convert each weight in
registers. Measured at the real model's shapes (kernel_choice.py, printed by `bench quant`),
ATen's own packed kernels (`_weight_int8pack_mm`, `_weight_int4pack_mm_for_cpu`) are slower than
float32 with float32 activations on this CPU, so the engine compiles its own.

The kernels are compiled once per machine with the system's C++ compiler (minillm/cpp: g++ -O3
-march=native -fopenmp), cached under ~/.cache/minillm, and loaded with ctypes. Without a compiler the path does
not exist (`available()` is False) and QuantizedLinear uses the reference.
"""
import ctypes
import functools
from pathlib import Path

import torch

from minillm import cpp

SOURCE = Path(__file__).with_name("fused_matvec.cpp")
MAX_ROWS = 16  # rows of x up to which the fused kernels beat dequantize-then-matmul (kernel_choice.py)


@functools.cache
def library(flags: tuple[str, ...] = ()) -> ctypes.CDLL | None:
    """The compiled kernels (minillm/cpp builds them on first use); None where there is no compiler or the
    build fails."""
    int4 = [cpp.PTR] * 6 + [cpp.I64] * 4 + [cpp.INT]
    return cpp.load(SOURCE, "the fused int8/int4 CPU kernels (quantized layers use the reference: dequantize, then "
                            "matmul)", {"int8_linear": [cpp.PTR] * 5 + [cpp.I64] * 3 + [cpp.INT],
                                        "int4_linear_u8zero": int4, "int4_linear_f32zero": int4}, flags)


def available() -> bool:
    """Whether the fused kernels exist on this machine (compiled, or compilable now)."""
    return library() is not None


def applies(x: torch.Tensor, stored: torch.Tensor) -> bool:
    """Whether a fused kernel takes this call: float32 x on a CPU, at most MAX_ROWS rows of it, the codes there too."""
    return (x.device.type == "cpu" and x.dtype == torch.float32 and x.numel() <= MAX_ROWS * x.shape[-1]
            and stored.device.type == "cpu" and available())


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


# A decode step calls a kernel 121 times a token on SmolLM2: each tensor is copied or converted only where it is
# not already what the kernel reads (a reshape, a contiguous() and a float() of each took 10 us a call, 2.4 ms a
# token on the 2-core AMD EPYC, where the int8 kernel itself takes 6.5 ms).
def _rows(x: torch.Tensor) -> torch.Tensor:
    """x [..., in] as contiguous rows [m, in]."""
    return x if x.dim() == 2 and x.is_contiguous() else x.reshape(-1, x.shape[-1]).contiguous()


def _as(t: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """t as a contiguous tensor of dtype (t itself when it is one)."""
    return t if t is None or (t.dtype == dtype and t.is_contiguous()) else t.to(dtype).contiguous()


def int8_linear(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """linear.scaled_linear for int8, fused. x: [..., in] float32; q: int8 [out, in]; scale: [out] -> [..., out]."""
    k, n = x.shape[-1], q.shape[0]
    x2 = _rows(x)                                                  # [m, in]
    q, scale, bias = _as(q, torch.int8), _as(scale, torch.float32), _as(bias, torch.float32)
    y = torch.empty(x2.shape[0], n, dtype=torch.float32)           # [m, out]
    library().int8_linear(_ptr(x2), _ptr(q), _ptr(scale), _ptr(bias), _ptr(y), x2.shape[0], n, k,
                          torch.get_num_threads())
    return y if x.dim() == 2 else y.view(*x.shape[:-1], n)


def int4_fits(in_features: int, groups: int) -> bool:
    """The int4 kernel reads whole bytes per group: the group size must be even."""
    return groups > 0 and in_features % groups == 0 and (in_features // groups) % 2 == 0


def int4_linear(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor,
                bias: torch.Tensor | None) -> torch.Tensor:
    """linear.int4_linear, fused. x: [..., in] float32; packed: uint8 [out, in / 2]; scale: [out, groups];
    zero: uint8 or float32 [out, groups], groups with an even size (int4_fits) -> [..., out]."""
    k, (n, groups) = x.shape[-1], scale.shape
    if not int4_fits(k, groups) or packed.shape != (n, k // 2):
        raise ValueError(f"the fused int4 kernel needs packed [out, {k // 2}] and an even group size dividing "
                         f"{k}; got packed {tuple(packed.shape)} and {groups} groups")
    x2 = _rows(x)                                                  # [m, in]
    packed, scale, bias = _as(packed, torch.uint8), _as(scale, torch.float32), _as(bias, torch.float32)
    kernel = library().int4_linear_u8zero if zero.dtype == torch.uint8 else library().int4_linear_f32zero
    zero = _as(zero, torch.uint8 if zero.dtype == torch.uint8 else torch.float32)
    y = torch.empty(x2.shape[0], n, dtype=torch.float32)           # [m, out]
    kernel(_ptr(x2), _ptr(packed), _ptr(scale), _ptr(zero), _ptr(bias), _ptr(y), x2.shape[0], n, k, groups,
           torch.get_num_threads())
    return y if x.dim() == 2 else y.view(*x.shape[:-1], n)
