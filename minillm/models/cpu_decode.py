"""A decode step on a CPU with each decoder layer in one C++ call (layers/cpu_ops.cpp: decoder_layer_f32).

At batch 1, a decode step of SmolLM2-135M streams its 540 MB of weights through 121 matrix-vector products. Between
two of them the layer runs its small operators one call at a time from Python: the norms, rotary, the K/V store
and attention, SwiGLU's middle, and the four products' wrappers, each through nn.Module, ctypes and torch's
allocator. Each is a few microseconds; a layer makes about ten, and a step thirty layers' worth: on the project's
2-core Intel Xeon (one thread, weights stubbed out so only these calls remain), ~80 us a layer, 2.4 ms of a 42 ms
step, the largest part of what kept decode under 90% of its bare loop of products. llama.cpp runs a step as a
compiled graph and pays none of it.

Here the same C++ operators run in the same order, inside one call a layer: the hidden states are equal to the bit
to the layer's own path (tests/test_cpu_decode.py), which stays the reference and runs everywhere else. It applies to
a step whose every row is a decode token of its own sequence on the paged pool's C++ kernel (the context says so:
`AttentionContext.cpu_decode_rows`), 1 to cpu_ops.MAX_ROWS rows, float32 on a CPU, without autograd or
torch.compile, on layers built of the plain modules (a quantized, tensor-parallel or otherwise replaced layer runs
its own path).
"""
import ctypes

import torch

from minillm.layers import cpu_ops
from minillm.layers.linear import Linear
from minillm.layers.rmsnorm import RMSNorm
from minillm.layers.rotary import RotaryEmbedding

WEIGHTS = ("input_norm", "qkv", "qkv_bias", "o", "post_norm", "gate_up", "down")


class LayerWeights(ctypes.Structure):  # cpu_ops.cpp's struct of the same name
    _fields_ = ([(name, ctypes.c_void_p) for name in WEIGHTS]
                + [(name, ctypes.c_int64) for name in ("hidden", "heads", "kv_heads", "head_dim", "inter")]
                + [("eps", ctypes.c_float), ("scale", ctypes.c_float)])


class DecodeRows(ctypes.Structure):  # cpu_ops.cpp's struct of the same name
    _fields_ = ([(name, ctypes.c_void_p) for name in ("slot_mapping", "tables", "context_lens", "seq_rows", "cos",
                                                       "sin_signed")]
                + [(name, ctypes.c_int64) for name in ("rows", "table_width", "block_size")]
                + [("threads", ctypes.c_int)])


def plain_tensors(layer: torch.nn.Module) -> tuple | None:
    """The layer's weights in WEIGHTS order, where it is built of the plain float32 modules whose products take the
    C++ path (Linear with few_rows, RMSNorm, the rotate-half RotaryEmbedding); else None."""
    attn, mlp = layer._modules["self_attn"], layer._modules["mlp"]
    norms = (layer._modules["input_layernorm"], layer._modules["post_attention_layernorm"])
    linears = (attn._modules["qkv_proj"], attn._modules["o_proj"], mlp._modules["gate_up_proj"],
               mlp._modules["down_proj"])
    if not (all(type(m) is Linear and m.few_rows for m in linears) and all(type(m) is RMSNorm for m in norms)
            and type(attn.rotary) is RotaryEmbedding):
        return None
    qkv, o, gate_up, down = (m._parameters["weight"] for m in linears)
    tensors = (norms[0]._parameters["weight"], qkv, linears[0]._parameters["bias"], o, norms[1]._parameters["weight"],
               gate_up, down)
    if not all(t is None or (t.dtype == torch.float32 and t.is_cpu and t.is_contiguous()) for t in tensors):
        return None
    return tensors


def layer_weights(layer: torch.nn.Module) -> LayerWeights | None:
    """The struct the C++ layer reads, made once and kept on the layer while its weight tensors stay the same
    objects (a weight replaced by another tensor makes it again); None where the layer is not plain."""
    tensors = plain_tensors(layer)
    if tensors is None:
        return None
    kept = layer.__dict__.get("_cpu_decode")
    if kept is not None and all(a is b for a, b in zip(kept[0], tensors)):
        return kept[1]
    attn, norm = layer.self_attn, layer.input_layernorm
    weights = LayerWeights(*(0 if t is None else t.data_ptr() for t in tensors), tensors[0].shape[0], attn.num_heads,
                           attn.num_kv_heads, attn.head_dim, layer.mlp.intermediate_size, norm.eps,
                           attn.head_dim ** -0.5)
    layer.__dict__["_cpu_decode"] = (tensors, weights)  # the tensors held: the struct points into them
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
    if None in weights:
        return None
    slot_mapping, tables, lens, seq_rows, pool = step
    cos, sin_signed = layers[0].self_attn.rotary._tables(positions, torch.float32)  # [rows, head_dim] each
    held = (slot_mapping, tables, lens, seq_rows, cos, sin_signed)
    rows = DecodeRows(*(t.data_ptr() for t in held), h.shape[0], tables.shape[1], pool.block_size,
                      torch.get_num_threads())
    return CpuDecode(layers, weights, rows, held, pool)
