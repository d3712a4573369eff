"""A decoder layer's operators in C++ for the CPU (cpu_ops.cpp): the product of a few rows by a weight
(single-stream decode, speculative verification), and the small operators between the matrix products, fused:
the residual add with the RMSNorm after it, rotary embeddings in place, SwiGLU's SiLU-and-multiply.

A decode step at batch 1 streams every weight from memory. The few-row product streams it faster than torch's
F.linear does (linear.py and models/huge_pages.py have the figures), and between two of a step's weight streams
the caches hold none of the code or data of the operators in between: each of their ~20 calls a layer pays
Python, the dispatcher and cold caches. On SmolLM2-135M (2-core AMD EPYC, one thread, paired steps) the fused
three took a decode step from 83% of the bare loop of its matrix products to 88%. They run where `applies` says:
on a CPU, in float32, without autograd and outside torch.compile (which fuses them itself), where the library
builds. Everywhere else, and as the reference in the tests, the layers' plain-PyTorch formulas run. A decode step
goes further: models/cpu_decode.py runs each whole layer as one call of the library (`decoder_layer_f32`).
"""
import ctypes
import functools
from pathlib import Path

import torch

from minillm import cpp

SOURCE = Path(__file__).with_name("cpu_ops.cpp")
MAX_ROWS = 32  # rows of x `linear` takes (faster than oneDNN's packed copy up to here, linear.py)


@functools.cache
def library(flags: tuple[str, ...] = ()) -> ctypes.CDLL | None:
    ptr, i64, f32, n = cpp.PTR, cpp.I64, cpp.F32, cpp.INT
    lib = cpp.load(SOURCE, "the layers' fused CPU operators (the layers run their PyTorch formulas instead)",
                   {"weight_panel_f32": [],
                    "linear_f32": [ptr, ptr, ptr, ptr, i64, i64, i64, n],
                    "rms_norm_f32": [ptr, i64, ptr, ptr, i64, i64, f32, n],
                    "add_rms_norm_f32": [ptr, i64, ptr, ptr, ptr, i64, i64, f32, n],
                    "rotary_f32": [ptr, i64, ptr, ptr, i64, i64, i64, n],
                    "silu_mul_f32": [ptr, i64, ptr, i64, i64, n],
                    # a whole decoder layer of a decode step (models/cpu_decode.py)
                    "decoder_layer_f32": [ptr, ptr, ptr, ptr, ptr, ptr, n, ptr]}, flags)
    if lib is not None:
        lib.weight_panel_f32.restype = i64
        lib.panel = lib.weight_panel_f32()  # asked once: `panel` runs on every product
    return lib


def applies(x: torch.Tensor) -> bool:
    """Whether x ([rows, ..., last], float32 on a CPU, its last dimension contiguous) takes the fused path now.
    (Each test here costs 0.05-0.1 us; `x.device.type` cost 0.3, and decode asks this ~200 times a token.)"""
    return (x.is_cpu and x.dtype == torch.float32 and x.stride(-1) == 1 and not torch.is_grad_enabled()
            and not torch.compiler.is_compiling() and library() is not None)


def panel() -> int:
    """How the C++ product reads a weight: in panels of this many of its rows (16 where the library is built with
    AVX-512), each stored column by column (`pack`); 0: [n, k] as nn.Linear holds it."""
    return library().panel


def pack(weight: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """weight [n, k] -> the layout the C++ product reads: itself where `panel()` is 0; else [ceil(n / P), k, P] with
    P = panel(), panel p holding weight rows P p to P p + P - 1 column by column (the last one padded with zeros).
    out: where to write it (numel: ceil(n / P) P k), else a new tensor."""
    width = panel()
    if not width:
        return weight
    (n, k), full = weight.shape, weight.shape[0] // width
    panels = -(-n // width)
    packed = torch.empty(panels, k, width) if out is None else out.view(panels, k, width)
    packed[:full].copy_(weight[:full * width].reshape(full, width, k).transpose(1, 2))
    if full < panels:
        packed[full].zero_()
        packed[full, :, :n - full * width].copy_(weight[full * width:].t())
    return packed


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x: [m, k] contiguous, 1 <= m <= MAX_ROWS; weight: [n, k] float32, contiguous; bias: [n] or None
    -> x @ weight.T + bias, [m, n]. (Packs the weight each call where the product reads panels: a layer keeps its
    packed copy instead, layers/linear.py.)"""
    m, k = x.shape
    if not (1 <= m <= MAX_ROWS and weight.shape[1] == k and x.is_contiguous() and weight.is_contiguous()
            and weight.dtype == torch.float32):
        raise ValueError(f"linear: x [m <= {MAX_ROWS}, k] and a contiguous float32 weight [n, k]; got x "
                         f"{tuple(x.shape)}, weight {tuple(weight.shape)} {weight.dtype}"
                         f"{'' if weight.is_contiguous() else ' (not contiguous)'}")
    return product(x, pack(weight), bias, weight.shape[0])


def product(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, n: int) -> torch.Tensor:
    """`linear` without its checks, for a caller that made them, on the weight `pack` made (layers/linear.py, once a
    call: decode makes 121 products a token on SmolLM2, and each microsecond around them is 0.5% of a step);
    n: the weight's rows."""
    y = torch.empty(x.shape[0], n)
    library().linear_f32(x.data_ptr(), packed.data_ptr(), 0 if bias is None else bias.data_ptr(), y.data_ptr(),
                         x.shape[0], n, x.shape[1], torch.get_num_threads())
    return y


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """x: [rows, n] -> rms_norm(x) * weight; with residual ([rows, n], contiguous): (rms_norm(x + residual) *
    weight, x + residual), the sum written into residual's own memory (the residual stream is updated in place)."""
    rows, n = shape = x.shape
    y = torch.empty(shape)
    if residual is None:
        library().rms_norm_f32(x.data_ptr(), x.stride(0), weight.data_ptr(), y.data_ptr(), rows, n, eps,
                               torch.get_num_threads())
        return y
    if residual.shape != shape or not residual.is_contiguous():
        raise ValueError(f"rms_norm: the residual must be contiguous and shaped like x {tuple(shape)}, got "
                         f"{tuple(residual.shape)}")
    library().add_rms_norm_f32(x.data_ptr(), x.stride(0), residual.data_ptr(), weight.data_ptr(), y.data_ptr(), rows,
                               n, eps, torch.get_num_threads())
    return y, residual


def rotary_(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """x: [rows, heads, d], each head's d contiguous and the heads d apart (rows may be further apart: a view of
    the qkv product), rotated in place; cos, sin_signed: [rows, d] contiguous, each row's position's tables. -> x"""
    rows, heads, d = x.shape
    if x.stride(1) != d or cos.shape != (rows, d) or sin_signed.shape != (rows, d):
        raise ValueError(f"rotary_: x [rows, heads, d] with heads d apart, tables [rows, d]; got x {tuple(x.shape)} "
                         f"strides {x.stride()}, tables {tuple(cos.shape)} and {tuple(sin_signed.shape)}")
    library().rotary_f32(x.data_ptr(), x.stride(0), cos.data_ptr(), sin_signed.data_ptr(), rows, heads, d,
                         torch.get_num_threads())
    return x


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up: [rows, 2 * inter], each row gate then up -> silu(gate) * up, [rows, inter]."""
    rows, width = gate_up.shape
    out = torch.empty(rows, width // 2)
    library().silu_mul_f32(gate_up.data_ptr(), gate_up.stride(0), out.data_ptr(), rows, width // 2,
                           torch.get_num_threads())
    return out
