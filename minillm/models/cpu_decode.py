"""A decode step on a CPU with each decoder layer in one C++ call (layers/cpu_ops.cpp: decoder_layer_f32).

At batch 1, a decode step of SmolLM2-135M streams its 540 MB of weights through 121 matrix-vector products. Between
two of them the layer runs its small operators one call at a time from Python: the norms, rotary, the K/V store
and attention, SwiGLU's middle, and the four products' wrappers, each through nn.Module, ctypes and torch's
allocator. Each is a few microseconds; a layer makes about ten, and a step thirty layers' worth: on the project's
2-core Intel Xeon (one thread, weights stubbed out so only these calls remain), ~80 us a layer, 2.4 ms of a 42 ms
step, the largest part of what kept decode under 90% of its bare loop of products. llama.cpp runs a step as a
compiled graph and pays none of it.

Here the same C++ operators run in the same order, inside one call a layer: the hidden states are equal to the bit to
the layer's own path (tests/models/test_cpu_decode.py), which stays the reference and runs everywhere else. Its
products are the ones the layer's modules would take: the few-row float32 product, or a quantized layer's own int8 /
int4 kernel (quant/fused_matvec.cpp, called by address). It applies to a step of 1 to cpu_ops.MAX_ROWS rows
(fused.MAX_ROWS where a layer is quantized), each a decode token on the paged pool's C++ kernel (one of a sequence's,
or a few consecutive ones: a speculative verification, a short prompt; the context says so:
`AttentionContext.cpu_decode_rows`), float32 on a CPU, without autograd or torch.compile, on layers built of the plain
modules (an fp8, tensor-parallel or otherwise replaced layer runs its own path). On SmolLM2 it took batch-1 decode
from 89% to 99-101% of its bare loop of products, and a verification of 4 draft tokens from 60 to 52 ms (one thread,
the Intel Xeon).
"""
import ctypes

import torch

from minillm.layers import cpu_ops
from minillm.layers.linear import Linear
from minillm.layers.rmsnorm import RMSNorm
from minillm.layers.rotary import RotaryEmbedding
from minillm.quant import fused
from minillm.quant.quantized_linear import QuantizedLinear

FP32, INT8, INT4_U8_ZERO, INT4_F32_ZERO = range(4)  # cpu_ops.cpp's ProductKind


class Product(ctypes.Structure):  # cpu_ops.cpp's struct of the same name: one matrix product of the layer
    _fields_ = [("kind", ctypes.c_int32)] + [(name, ctypes.c_void_p) for name in ("weight", "scale", "zero", "bias",
                                                                                  "kernel")] \
        + [(name, ctypes.c_int64) for name in ("n", "k", "groups")]


class LayerWeights(ctypes.Structure):  # cpu_ops.cpp's struct of the same name
    # (and, for Python only, the most rows a step may have here: as many as each of the layer's products takes in
    # the module's own forward; beyond fused.MAX_ROWS a quantized layer multiplies by a float weight instead)
    max_rows = cpu_ops.MAX_ROWS
    _fields_ = ([("input_norm", ctypes.c_void_p), ("post_norm", ctypes.c_void_p)]
                + [(name, Product) for name in ("qkv", "o", "gate_up", "down")]
                + [(name, ctypes.c_int64) for name in ("hidden", "heads", "kv_heads", "head_dim", "inter")]
                + [("eps", ctypes.c_float), ("scale", ctypes.c_float)])


class DecodeRows(ctypes.Structure):  # cpu_ops.cpp's struct of the same name
    _fields_ = ([(name, ctypes.c_void_p) for name in ("slot_mapping", "tables", "context_lens", "seq_rows", "cos",
                                                       "sin_signed")]
                + [(name, ctypes.c_int64) for name in ("rows", "table_width", "block_size")]
                + [("threads", ctypes.c_int)])


def kernel_ready(t: torch.Tensor | None, dtype: torch.dtype = torch.float32) -> bool:
    """Whether t (None: no tensor) is what a kernel reads as it is: contiguous, of dtype, in CPU memory."""
    return t is None or (t.dtype == dtype and t.is_cpu and t.is_contiguous())


KERNEL_KINDS = {"int8_linear": (INT8, torch.int8, None), "int4_linear_u8zero": (INT4_U8_ZERO, torch.uint8, torch.uint8),
                "int4_linear_f32zero": (INT4_F32_ZERO, torch.uint8, torch.float32)}  # kind, codes' and zero's dtypes


def product(module: torch.nn.Module) -> tuple[int, tuple, int | None, int] | None:
    """How the module's own forward multiplies 1 to cpu_ops.MAX_ROWS rows on a CPU (a quantized one, up to
    fused.MAX_ROWS), where the C++ layer can do the same: (kind, its tensors (weight, scale, zero, bias), the quantized
    kernel's address, groups); None where it cannot (a module of another kind, one whose forward takes another path,
    or tensors the kernel would need converted first)."""
    if type(module) is Linear:
        weight, bias = module._parameters["weight"], module._parameters["bias"]
        ok = module.few_rows and kernel_ready(weight) and kernel_ready(bias)
        return (FP32, (module.few_rows_weight(), None, None, bias), None, 0) if ok else None
    if type(module) is not QuantizedLinear or not fused.available():
        return None
    kernel = module.fused_kernel()
    if kernel is None:
        return None
    kind, codes_dtype, zero_dtype = KERNEL_KINDS[kernel]
    buffers, bias = module._buffers, module._parameters.get("bias")
    q, scale, zero = buffers["qweight"], buffers["scale"], buffers.get("zero") if zero_dtype else None
    if not (kernel_ready(q, codes_dtype) and kernel_ready(scale) and kernel_ready(bias)
            and (zero_dtype is None or kernel_ready(zero, zero_dtype))):
        return None
    if kind != INT8 and q.shape != (module.out_features, module.in_features // 2):
        return None
    address = ctypes.cast(getattr(fused.library(), kernel), ctypes.c_void_p).value
    return kind, (q, scale, zero, bias), address, 0 if kind == INT8 else scale.shape[1]


def layer_weights(layer: torch.nn.Module) -> LayerWeights | None:
    """The struct the C++ layer reads, or None where the layer is not built of modules it can run (RMSNorm, the
    rotate-half RotaryEmbedding, products `product` takes). Made once and kept on the layer while the same modules
    hold tensors at the same addresses, versions and path flags: a module or weight replaced, moved (`.data =`, as
    models/huge_pages.py does) or changed in place makes it again. (This check is most of the path's Python: ~8 us
    a layer.)"""
    attn, mlp = layer._modules["self_attn"], layer._modules["mlp"]
    modules = (layer._modules["input_layernorm"], layer._modules["post_attention_layernorm"], attn._modules["qkv_proj"],
               attn._modules["o_proj"], mlp._modules["gate_up_proj"], mlp._modules["down_proj"])
    key = (modules, attn.rotary, [t.data_ptr() for m in modules for t in (*m._parameters.values(),
                                                                          *m._buffers.values()) if t is not None],
           [m.__dict__.get("few_rows") or m.__dict__.get("kernel") for m in modules],
           # a float weight changed in place (a new version): the C++ product's panel copy of it is made again
           [w._version for m in modules[2:] if type(m) is Linear and not (w := m._parameters["weight"]).is_inference()])
    kept = layer.__dict__.get("_cpu_decode")
    if kept is not None and kept[0] == key:
        return kept[1]
    norms, products = modules[:2], [product(m) for m in modules[2:]]
    if (None in products or type(attn.rotary) is not RotaryEmbedding
            or not all(type(m) is RMSNorm and kernel_ready(m._parameters["weight"]) for m in norms)):
        layer.__dict__["_cpu_decode"] = (key, None)
        return None
    ptr = lambda t: None if t is None else t.data_ptr()  # noqa: E731
    weights = LayerWeights(norms[0]._parameters["weight"].data_ptr(), norms[1]._parameters["weight"].data_ptr(),
                           *(Product(kind, *map(ptr, held), kernel, m.out_features, m.in_features, groups)
                             for m, (kind, held, kernel, groups) in zip(modules[2:], products)),
                           norms[0]._parameters["weight"].shape[0], attn.num_heads, attn.num_kv_heads, attn.head_dim,
                           mlp.intermediate_size, norms[0].eps, attn.head_dim ** -0.5)
    if any(kind != FP32 for kind, *_ in products):
        weights.max_rows = min(cpu_ops.MAX_ROWS, fused.MAX_ROWS)
    layer.__dict__["_cpu_decode"] = (key, weights)
    return weights


class CpuDecode:
    """One decode step's layers through the C++ call: `run(i, h, x)` for layer i returns what
    DecoderLayer.forward(positions, h, x, ctx) would."""

    def __init__(self, layers: torch.nn.ModuleList, weights: list[LayerWeights], rows: DecodeRows, held: tuple,
                 pool) -> None:
        self.held = held  # the step's tensors the rows struct points into
        self.rows = ctypes.byref(rows)
        self.call = cpu_ops.library().decoder_layer_f32
        ids = [layer.self_attn.layer_idx for layer in layers]  # each layer's K/V in the pool
        self.args = [(ctypes.byref(w), pool.k_slots[i].data_ptr(), pool.v_slots[i].data_ptr())
                     for w, i in zip(weights, ids)]

    def run(self, i: int, h: torch.Tensor, x: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """h: [rows, hidden], the last sublayer's output (the first layer: the embeddings, and x None)
        -> (layer i's MLP output, the residual stream, updated in place)."""
        first = x is None
        x = h if first else x  # the stream starts as the embeddings
        out = torch.empty(h.shape)  # [rows, hidden]
        weights, k_slots, v_slots = self.args[i]
        self.call(weights, self.rows, k_slots, v_slots, h.data_ptr(), x.data_ptr(), first, out.data_ptr())
        return out, x


def cpu_decode(layers: torch.nn.ModuleList, positions: torch.Tensor, h: torch.Tensor, ctx) -> CpuDecode | None:
    """The step's layers through the C++ call where everything allows it (the top of this file); else None, and the
    layers run their own forward. positions: [rows]; h: [rows, hidden], the embeddings."""
    if ctx is None or not (h.ndim == 2 and 1 <= h.shape[0] <= cpu_ops.MAX_ROWS and h.is_contiguous()
                           and cpu_ops.applies(h)):
        return None
    step = ctx.cpu_decode_rows()
    if step is None:
        return None
    weights = [layer_weights(layer) for layer in layers]
    if None in weights or h.shape[0] > min(w.max_rows for w in weights):
        return None
    slot_mapping, tables, lens, seq_rows, pool = step
    cos, sin_signed = layers[0].self_attn.rotary._tables(positions, torch.float32)  # [rows, head_dim] each
    held = (slot_mapping, tables, lens, seq_rows, cos, sin_signed)
    rows = DecodeRows(*(t.data_ptr() for t in held), h.shape[0], tables.shape[1], pool.block_size,
                      torch.get_num_threads())
    return CpuDecode(layers, weights, rows, held, pool)
