"""Each kernel of minillm/kernels on small inputs: its knobs, one recorded run, and its PyTorch reference.

`run_case(kernel, values)` launches the engine's own kernel (through its launcher where the launcher takes
the block sizes, else directly) with its memory accesses recorded, and checks the output against the
kernel's spec. Inputs are seeded, so a choice of sizes always draws the same picture.
"""
from dataclasses import dataclass

import torch

from minillm_visualizer.kernels.trace import Launch, record

POW2 = [2, 4, 8, 16, 32, 64, 128]
DOT = [16, 32, 64]  # tl.dot tiles: powers of two, at least 16


@dataclass(frozen=True)
class Knob:
    name: str
    label: str
    default: int
    low: int = 1
    high: int = 128
    choices: tuple[int, ...] | None = None  # a set of block sizes instead of a range
    help: str = ""


KNOBS: dict[str, list[Knob]] = {
    "vector add": [Knob("n", "Elements n", 10, 1, 256),
                   Knob("block", "BLOCK", 4, choices=tuple(POW2), help="Elements per program.")],
    "RMSNorm": [Knob("rows", "Rows", 4, 1, 16), Knob("hidden", "Hidden size", 12, 1, 128)],
    "softmax": [Knob("rows", "Rows", 3, 1, 16), Knob("cols", "Columns", 20, 1, 256),
                Knob("block", "BLOCK", 8, choices=tuple(POW2),
                     help="A row longer than BLOCK is read in blocks, twice (the online softmax).")],
    "matmul": [Knob("m", "M", 40, 1, 96), Knob("n", "N", 24, 1, 96), Knob("k", "K", 48, 1, 96),
               Knob("block_m", "BLOCK_M", 16, choices=tuple(DOT)), Knob("block_n", "BLOCK_N", 16, choices=tuple(DOT)),
               Knob("block_k", "BLOCK_K", 16, choices=tuple(DOT))],
    "int4 matmul": [Knob("m", "Tokens M", 3, 1, 32), Knob("n", "Outputs N", 40, 1, 96),
                    Knob("k", "Inputs K", 64, 2, 128), Knob("group", "Group size", 16, 1, 128,
                                                             help="Inputs sharing one scale and zero point."),
                    Knob("block_m", "BLOCK_M", 16, choices=tuple(DOT)),
                    Knob("block_n", "BLOCK_N", 16, choices=tuple(DOT)),
                    Knob("block_k", "BLOCK_K", 32, choices=tuple(DOT))],
    "paged decode attention": [
        Knob("seqs", "Sequences", 3, 1, 4), Knob("longest", "Longest context", 70, 1, 200,
                                                 help="The other sequences are shorter: about 1/2, 1/8, 3/4 of it."),
        Knob("block_size", "Block size (tokens)", 8, choices=(2, 4, 8, 16)),
        Knob("heads", "Query heads", 4, 1, 8), Knob("kv_heads", "KV heads", 2, 1, 8),
        Knob("d", "Head dim", 8, choices=(4, 8, 16))],
}
OUTPUTS = {"vector add": ["out_ptr"], "RMSNorm": ["y_ptr", "h_ptr"], "softmax": ["out_ptr"], "matmul": ["c_ptr"],
           "int4 matmul": ["y_ptr"], "paged decode attention": ["out_ptr"]}


@dataclass
class CaseRun:
    launch: Launch          # the kernel's one launch
    error: float            # max |kernel - reference| over the output
    reference: str          # the spec it was checked against
    outputs: list[str]      # the buffers the kernel must write, each element exactly once
    lens: list[int] | None = None            # paged decode: each sequence's context length
    tables: torch.Tensor | None = None       # paged decode: the block tables [B, width]


def defaults(kernel: str) -> dict[str, int]:
    return {k.name: k.default for k in KNOBS[kernel]}


def context_lens(seqs: int, longest: int) -> list[int]:
    """Varied lengths, the longest first: what a batch of decodes looks like."""
    return [max(1, round(longest * f)) for f in (1, 1 / 2, 1 / 8, 3 / 4)[:seqs]]


def check(kernel: str, v: dict[str, int]) -> None:
    """Raise a ValueError, for people, for sizes the kernel does not take."""
    if kernel == "int4 matmul" and (v["k"] % 2 or v["k"] % v["group"]):
        raise ValueError(f"the int4 format packs two codes a byte and whole groups a row: Inputs K must be even and a "
                         f"multiple of the group size, got K = {v['k']} and groups of {v['group']}")
    if kernel == "paged decode attention" and v["heads"] % v["kv_heads"]:
        raise ValueError(f"each KV head serves a whole group of query heads: KV heads must divide query heads, "
                         f"got {v['heads']} query heads and {v['kv_heads']} KV heads")


def run_case(kernel: str, v: dict[str, int]) -> CaseRun:
    """Run `kernel` on seeded inputs of the sizes in `v`, recorded; -> the launch and its error against the spec."""
    check(kernel, v)
    g = torch.Generator().manual_seed(0)
    r = lambda *shape: torch.randn(*shape, generator=g)  # noqa: E731
    extra = {}
    if kernel == "vector add":
        from minillm.kernels.vector_add import vector_add, vector_add_spec
        x, y = r(v["n"]), r(v["n"])
        out, launches = record(lambda: vector_add(x, y, block=v["block"]))
        ref, spec = vector_add_spec(x, y), "vector_add_spec"
    elif kernel == "RMSNorm":
        from minillm.kernels.fused_add_rmsnorm import rmsnorm_residual, rmsnorm_residual_spec
        args = (r(v["rows"], v["hidden"]), r(v["rows"], v["hidden"]), r(v["hidden"]), 1e-5)
        (out, _), launches = record(lambda: rmsnorm_residual(*args))
        ref, spec = rmsnorm_residual_spec(*args)[0], "rmsnorm_residual_spec"
    elif kernel == "softmax":
        from minillm.kernels.softmax import softmax, softmax_spec
        x = 4 * r(v["rows"], v["cols"])
        out, launches = record(lambda: softmax(x, block=v["block"]))
        ref, spec = softmax_spec(x), "softmax_spec"
    elif kernel == "matmul":
        from minillm.kernels.matmul import matmul, matmul_spec
        a, b = r(v["m"], v["k"]), r(v["k"], v["n"])
        out, launches = record(lambda: matmul(a, b, v["block_m"], v["block_n"], v["block_k"]))
        ref, spec = matmul_spec(a, b), "matmul_spec"
    elif kernel == "int4 matmul":
        out, ref, launches = _int4(v, r)
        spec = "int4_linear_spec"
    else:
        out, ref, launches, extra = _paged_decode(v)
        spec = "paged_decode_spec"
    error = (out.float() - ref.float()).abs().max().item()
    return CaseRun(launches[0], error, spec, OUTPUTS[kernel], **extra)


def _int4(v: dict[str, int], r):
    """Launched directly: its launcher picks the tiles itself (16-32 x 128 x 128 here), and here you pick them."""
    from minillm.kernels.int4_matmul import int4_linear_spec, int4_matmul_kernel
    from minillm.kernels.runtime import triton
    from minillm.quant import codecs
    codes, scale, zero = codecs.quantize_int4(r(v["n"], v["k"]), v["group"])
    x, packed = r(v["m"], v["k"]), codecs.pack_int4(codes)  # [M, K]; uint8 [N, K / 2]
    y = torch.empty(v["m"], v["n"])

    def launch():
        grid = (triton.cdiv(v["m"], v["block_m"]), triton.cdiv(v["n"], v["block_n"]))
        int4_matmul_kernel[grid](x, packed, scale, zero, scale, y, v["m"], v["n"], v["k"], v["group"],
                                 x.stride(0), x.stride(1), packed.stride(0), scale.stride(0), zero.stride(0),
                                 y.stride(0), y.stride(1), HAS_BIAS=False,
                                 BLOCK_M=v["block_m"], BLOCK_N=v["block_n"], BLOCK_K=v["block_k"])
    _, launches = record(launch)
    return y, int4_linear_spec(x, packed, scale, zero, None), launches


def _paged_decode(v: dict[str, int]):
    """The benchmark's case: blocks handed out shuffled over a pool just big enough."""
    from minillm.bench.kernels import paged_case
    from minillm.kernels.paged_decode import paged_decode_attention, paged_decode_spec
    lens = context_lens(v["seqs"], v["longest"])
    q, k, val, tables, ctx = paged_case(lens, v["block_size"], v["heads"], v["kv_heads"], v["d"], torch.float32,
                                        torch.device("cpu"))
    out, launches = record(lambda: paged_decode_attention(q, k, val, tables, ctx, v["block_size"]))
    ref = paged_decode_spec(q, k, val, tables, ctx, v["block_size"])
    return out, ref, launches, {"lens": lens, "tables": tables}
