"""QuantizedLinear: a linear layer that keeps its weight in a codec's few bits and computes with it on
the fly, in every forward, so only the small form stays in memory.

    y = x @ dequant(W).T + b

Two ways to compute it. The reference, plain PyTorch, rebuilds the float weight and multiplies:
for int8 and fp8 the row scale waits until after the product, x @ (q * s).T = (x @ q.T) * s, and
int4's weight is rebuilt group by group (its scales vary along the input). It is what the fused
kernels are tested against and what lab 06's exercises reproduce. The fused path (fused.py) reads
the codes and converts them in registers, never writing the float weight: the default on a CPU
for the few rows of a decode step (QuantConfig.kernel = "fused"), where the reference's extra float
copy costs more than the matmul it feeds. A learner's or a Triton int4_linear (QuantOps) always
takes the place of both.
"""
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from minillm.quant import codecs, fused
from minillm.quant.quant_config import INT4_RANGES, KERNELS, SCHEMES


def scaled_linear(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """int8 or fp8 codes with one scale per row. x: [n, in]; q: [out, in]; scale: [out] -> [n, out]."""
    y = F.linear(x, q.to(x.dtype)) * scale.to(x.dtype)
    return y if bias is None else y + bias


def int4_linear(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor,
                bias: torch.Tensor | None) -> torch.Tensor:
    """x: [n, in]; packed: uint8 [out, ceil(in / 2)]; scale, zero: [out, in // group_size] -> [n, out]."""
    codes = codecs.unpack_int4(packed, x.shape[-1])                       # [out, in]
    return F.linear(x, codecs.dequantize_int4(codes, scale, zero).to(x.dtype), bias)


def int4_linear_triton(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor,
                       bias: torch.Tensor | None) -> torch.Tensor:
    """int4_linear as one fused Triton kernel (minillm/kernels/int4_matmul.py): the codes are unpacked
    and dequantized tile by tile in registers. The Triton backend's QuantOps.int4_linear."""
    from minillm.kernels.int4_matmul import int4_linear as fused  # imports triton: only when used
    return fused(x, packed, scale, zero, bias)


@dataclass(frozen=True)
class QuantOps:
    """The functions a QuantizedLinear quantizes and multiplies with: the engine's own by default, a
    learner's (lab 06, through EngineConfig.components) or a kernel's in their place."""
    quantize_int8: Callable = codecs.quantize_int8    # (w) -> (q, scale)
    quantize_int4: Callable = codecs.quantize_int4    # (w, group_size) -> (codes, scale, zero)
    pack_int4: Callable = codecs.pack_int4            # (codes) -> packed
    int4_linear: Callable = int4_linear               # (x, packed, scale, zero, bias) -> y


class QuantizedLinear(nn.Module):
    """nn.Linear's interface over a quantized weight. Buffers (what a checkpoint stores):
    int8 qweight int8 [out, in], scale [out];  fp8 qweight float8_e4m3fn [out, in], scale [out];
    int4 qweight uint8 [out, ceil(in / 2)] (two codes a byte), scale and zero [out, in // group_size]
    (zero uint8 when the range holds 0, float32 for min-max)."""

    def __init__(self, in_features: int, out_features: int, scheme: str, group_size: int = 64,
                 bias: bool = False, dtype: torch.dtype = torch.float32, device=None, ops: QuantOps | None = None,
                 int4_range: str = "holds-zero", kernel: str = "fused"):
        super().__init__()
        if scheme not in SCHEMES:
            raise ValueError(f"quantization scheme must be one of {', '.join(SCHEMES)}, got {scheme!r}")
        if int4_range not in INT4_RANGES or kernel not in KERNELS:
            raise ValueError(f"int4_range must be one of {', '.join(INT4_RANGES)} and kernel one of "
                             f"{', '.join(KERNELS)}, got {int4_range!r} and {kernel!r}")
        self.in_features, self.out_features, self.scheme = in_features, out_features, scheme
        self.group_size = group_size if scheme == "int4" else None
        self.int4_range = int4_range if scheme == "int4" else None
        self.kernel = kernel
        self.ops = ops or QuantOps()
        empty = dict(device=device)
        if scheme == "int4":
            codecs.check_group_size(in_features, group_size)
            groups = in_features // group_size
            packed = (in_features + 1) // 2  # two codes a byte
            self.register_buffer("qweight", torch.zeros(out_features, packed, dtype=torch.uint8, **empty))
            self.register_buffer("scale", torch.zeros(out_features, groups, **empty))
            zero_dtype = torch.uint8 if int4_range == "holds-zero" else torch.float32
            self.register_buffer("zero", torch.zeros(out_features, groups, dtype=zero_dtype, **empty))
        else:
            if scheme == "fp8":
                codecs.require_fp8()
            qdtype = torch.int8 if scheme == "int8" else codecs.FP8_DTYPE
            self.register_buffer("qweight", torch.zeros(out_features, in_features, dtype=qdtype, **empty))
            self.register_buffer("scale", torch.zeros(out_features, **empty))
        self.bias = nn.Parameter(torch.zeros(out_features, dtype=dtype, **empty)) if bias else None

    @classmethod
    def from_weight(cls, weight: torch.Tensor, bias: torch.Tensor | None, scheme: str, group_size: int = 64,
                    ops: QuantOps | None = None, int4_range: str = "holds-zero",
                    kernel: str = "fused") -> "QuantizedLinear":
        """Quantize weight [out, in] (and keep bias [out] as it is). min-max int4 always uses
        codecs.quantize_int4_minmax: QuantOps.quantize_int4 (lab 06's) is the range-holds-0 codec."""
        out_features, in_features = weight.shape
        layer = cls(in_features, out_features, scheme, group_size, bias is not None, weight.dtype, weight.device, ops,
                    int4_range, kernel)
        with torch.no_grad():
            w = weight.detach().float()
            if scheme == "int8":
                q, scale = layer.ops.quantize_int8(w)
            elif scheme == "fp8":
                q, scale = codecs.quantize_fp8(w)
            else:
                quantize = layer.ops.quantize_int4 if int4_range == "holds-zero" else codecs.quantize_int4_minmax
                codes, scale, zero = quantize(w, group_size)
                q = layer.ops.pack_int4(codes)
                layer.zero.copy_(zero)
            layer.qweight.copy_(q)
            layer.scale.copy_(scale)
            if bias is not None:
                layer.bias.copy_(bias)
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [n, in] -> [n, out]"""
        # The buffers from their dict: nn.Module's attribute lookup costs a microsecond each, and decode runs this
        # 121 times a token on SmolLM2
        buffers = self._buffers
        q, scale = buffers["qweight"], buffers["scale"]
        kernel = self.fused_kernel() if fused.applies(x, q) else None
        if kernel == "int8_linear":
            return fused.int8_linear(x, q, scale, self.bias)
        if kernel is not None:
            return fused.int4_linear(x, q, scale, buffers["zero"], self.bias)
        if self.scheme == "int4":
            return self.ops.int4_linear(x, q, scale, buffers["zero"], self.bias)
        return scaled_linear(x, q, scale, self.bias)

    def fused_kernel(self) -> str | None:
        """The fused CPU kernel (quant/fused_matvec.cpp, by name) this layer multiplies a few float32 rows with, or
        None where it takes another path: fp8, kernel="reference", a replaced int4_linear (a learner's), or a group
        size the int4 kernel cannot read. forward asks it, and so does the C++ decode layer (models/cpu_decode.py)."""
        if self.kernel != "fused":
            return None
        if self.scheme == "int8":
            return "int8_linear"
        if (self.scheme != "int4" or self.ops.int4_linear is not int4_linear
                or not fused.int4_fits(self.in_features, self._buffers["scale"].shape[1])):
            return None
        return "int4_linear_u8zero" if self._buffers["zero"].dtype == torch.uint8 else "int4_linear_f32zero"

    def dequantized_weight(self) -> torch.Tensor:
        """The weight this layer multiplies by, [out, in] float32."""
        if self.scheme == "int4":
            return codecs.dequantize_int4(codecs.unpack_int4(self.qweight, self.in_features), self.scale, self.zero)
        if self.scheme == "int8":
            return codecs.dequantize_int8(self.qweight, self.scale)
        return codecs.dequantize_fp8(self.qweight, self.scale)

    def weight_bytes(self) -> int:
        """Bytes of the stored weight: codes, scales and zero points (the bias is not counted)."""
        return sum(b.numel() * b.element_size() for b in self.buffers())

    def extra_repr(self) -> str:
        group = f", group_size={self.group_size}, int4_range={self.int4_range}" if self.group_size else ""
        return (f"in_features={self.in_features}, out_features={self.out_features}, scheme={self.scheme}{group}, "
                f"kernel={self.kernel}")


class StackedLinear(nn.Module):
    """Several linear layers side by side on the same input, outputs concatenated: a fused matrix
    (qkv, gate_up) whose row blocks are quantized differently (only q, say)."""

    def __init__(self, parts: list[nn.Module]) -> None:
        super().__init__()
        self.parts = nn.ModuleList(parts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [n, in] -> [n, sum of the parts' out]"""
        return torch.cat([part(x) for part in self.parts], dim=-1)
