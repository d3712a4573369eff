"""Which matmul a quantized layer should run on this CPU: every candidate timed at a model's own
shapes, for the few rows of x a decode step has (`bench quant` prints the table).

Per scheme, beside float32's F.linear:
    reference   linear.py: dequantize the whole weight into a float32 tensor, then F.linear
    fused       fused.py: the codes read and converted in registers, no float weight written
    aten        ATen's packed kernels with float32 x: torch.ops.aten._weight_int8pack_mm (int8 codes
                [N, K], scales [N]) and _weight_int4pack_mm_for_cpu (codes repacked by
                _convert_weight_to_int4pack_for_cpu, scales and zeros [K / g, N, 2], w = (q - 8) * s + z)
    aten bf16   the same with x (and the scales) in bfloat16, where ATen has its vectorized path:
                timed for the record, not a candidate, since it rounds the activations to 8 bits
    inductor    torch.compile of the reference's dequantize-matvec (full runs, one row only: it
                compiles once per shape)
A weight the size of a model's layer stays in a CPU's caches, so each shape is allocated once per
decoder layer (the LM head once) and every timing sweeps all the copies, as a decode step does.
"""
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from minillm.quant import codecs, fused
from minillm.quant.quantized_linear import int4_linear, scaled_linear

ROWS = (1, 4, 8, 16)


def model_shapes(config) -> dict[str, tuple[int, int, int]]:
    """name -> (out, in, copies) of a Llama-family model's matmuls: its fused qkv and gate_up, o, down, the LM head."""
    heads, kv, dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    hidden, inter, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    return {"qkv": ((heads + 2 * kv) * dim, hidden, layers), "o": (hidden, heads * dim, layers),
            "gate_up": (2 * inter, hidden, layers), "down": (hidden, inter, layers),
            "lm_head": (config.vocab_size, hidden, 1)}


def median_seconds(fn: Callable, weights: list, x: torch.Tensor, repeats: int) -> float:
    """Median over `repeats` sweeps of the time of one call, each sweep calling fn(x, w) for every copy."""
    fn(x, weights[0])  # warm-up (and the fused library's build)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for w in weights:
            fn(x, w)
        times.append((time.perf_counter() - start) / len(weights))
    return statistics.median(times)


def int8_candidates(ws: list[torch.Tensor]) -> dict[str, tuple[Callable, list]]:
    coded = [codecs.quantize_int8(w) for w in ws]
    bf16 = [(q, s.bfloat16()) for q, s in coded]
    return {"reference": (lambda x, c: scaled_linear(x, c[0], c[1], None), coded),
            "fused": (lambda x, c: fused.int8_linear(x, c[0], c[1], None), coded),
            "aten": (lambda x, c: torch.ops.aten._weight_int8pack_mm(x, c[0], c[1]), coded),
            "aten bf16": (lambda x, c: torch.ops.aten._weight_int8pack_mm(x.bfloat16(), c[0], c[1]).float(), bf16)}


def int4_candidates(ws: list[torch.Tensor], group_size: int) -> dict[str, tuple[Callable, list]]:
    coded, aten = [], []
    for w in ws:
        codes, scale, zero = codecs.quantize_int4(w, group_size)
        coded.append((codecs.pack_int4(codes), scale, zero))
        # ATen's zero is the weight at code 8: (q - z) * s = (q - 8) * s + (8 - z) * s
        scales_and_zeros = torch.stack([scale.T, ((8 - zero.float()) * scale).T], dim=-1).contiguous()  # [K/g, N, 2]
        aten.append((torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.int(), 1), scales_and_zeros))
    aten_bf16 = [(p, sz.bfloat16()) for p, sz in aten]
    mm = torch.ops.aten._weight_int4pack_mm_for_cpu
    return {"reference": (lambda x, c: int4_linear(x, *c, None), coded),
            "fused": (lambda x, c: fused.int4_linear(x, *c, None), coded),
            "aten": (lambda x, c: mm(x, c[0], group_size, c[1]), aten),
            "aten bf16": (lambda x, c: mm(x.bfloat16(), c[0], group_size, c[1]).float(), aten_bf16)}


def compiled(scheme: str) -> Callable:
    """The reference's dequantize-matvec for one row as one torch.compile'd function (a reduction, so
    inductor can fuse the dequantization into it instead of handing a float weight to a GEMM)."""
    if scheme == "int8":
        return torch.compile(lambda x, c: (x * c[0].float()).sum(-1) * c[1], dynamic=False)
    return torch.compile(lambda x, c: (x * codecs.dequantize_int4(codecs.unpack_int4(c[0], x.shape[-1]), c[1], c[2])
                                       ).sum(-1), dynamic=False)


def measure(shapes: dict[str, tuple[int, int, int]], group_size: int, repeats: int, inductor: bool,
            rows: tuple[int, ...] = ROWS) -> list[dict]:
    """One record per scheme, shape and row count: microseconds per call of each candidate (None: unavailable)."""
    records = []
    gen = torch.Generator().manual_seed(0)
    for name, (n, k, copies) in shapes.items():
        ws = [torch.randn(n, k, generator=gen) * 0.02 for _ in range(copies)]  # [n, k] each
        for scheme, candidates in (("int8", int8_candidates(ws)), (f"int4-g{group_size}",
                                                                   int4_candidates(ws, group_size))):
            if not fused.available():
                candidates.pop("fused")
            for m in rows:
                x = torch.randn(m, k, generator=gen)
                micro = {"fp32": median_seconds(lambda x, w: F.linear(x, w), ws, x, repeats) * 1e6}
                micro.update({c: median_seconds(fn, items, x, repeats) * 1e6 for c, (fn, items) in candidates.items()})
                if inductor and m == 1:
                    micro["inductor"] = median_seconds(compiled(scheme[:4]), candidates["reference"][1], x[0],
                                                       repeats) * 1e6
                records.append({"scheme": scheme, "shape": name, "out x in": f"{n}x{k}", "copies": copies,
                                "rows": m, "us": micro})
        del ws
    return records


def best(record: dict) -> str:
    """The fastest candidate that computes in float32 (aten bf16 rounds the activations: not one)."""
    return min((c for c in record["us"] if c != "aten bf16"), key=lambda c: record["us"][c])


def table_rows(records: list[dict]) -> list[dict]:
    """measure()'s records as table rows: microseconds per call, fused against float32, the fastest."""
    names = list(dict.fromkeys(c for r in records for c in r["us"]))
    return [{"scheme": r["scheme"], "matrix": f"{r['shape']} {r['out x in']}", "rows": r["rows"],
             **{f"{c} us": f"{r['us'][c]:,.0f}" if c in r["us"] else "-" for c in names},
             "fused vs fp32": f"{r['us']['fp32'] / r['us']['fused']:.2f}x" if "fused" in r["us"] else "-",
             "best": best(r)} for r in records]
