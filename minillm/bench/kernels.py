"""The Triton kernels (minillm/kernels/) against their torch references, measured side by side.

On a GPU: the device's own peaks first (a large copy for bandwidth, a large bf16 matmul for FLOP/s),
then each kernel and its reference: time, achieved bandwidth and FLOP/s as fractions of those
peaks; paged decode attention at batch 1-64 and context 512-8k; the fused int4 matmul at batch 1-16
(against the torch int4 path and a dense bf16 matmul); end-to-end decode on the Triton backend
against the torch backend, same greedy tokens. On a CPU the kernels run in Triton's interpreter,
whose speed means nothing: it says so, runs a correctness smoke pass of every kernel, and exits 0.
"""
import statistics
from functools import partial

import torch
import torch.nn.functional as F

from minillm import LLM, SamplingParams
from minillm.bench import print_table, write_json
from minillm.bench.conditions import check_conditions, machine_line
from minillm.perf import median_time
from minillm.perf.machine import measure_bandwidth, measure_flops


def paged_case(lens: list[int], block_size: int, heads: int, kv_heads: int, d: int, dtype, device, seed: int = 0):
    """Sequences of these context lengths over a pool whose blocks are handed out shuffled.
    -> (q [B, heads, d], k_slots, v_slots [slots, kv_heads, d], block_tables int32 [B, width], lens int32 [B])."""
    g = torch.Generator().manual_seed(seed)
    widths = [-(-n // block_size) for n in lens]
    order = torch.randperm(sum(widths), generator=g).tolist()
    tables, at = [], 0
    for w in widths:
        tables.append(order[at:at + w] + [0] * (max(widths) - w))
        at += w
    slots = sum(widths) * block_size
    on_device = torch.Generator(device=device).manual_seed(seed)  # gigabytes of K/V at batch 64 x 8k: drawn there
    make = lambda *shape: torch.randn(*shape, generator=on_device, device=device).to(dtype)  # noqa: E731
    as_int = partial(torch.tensor, dtype=torch.int32, device=device)
    return make(len(lens), heads, d), make(slots, kv_heads, d), make(slots, kv_heads, d), as_int(tables), as_int(lens)


def smoke(device) -> list[dict]:
    """Every kernel once on small inputs that cross its block edges, against its spec."""
    from minillm.kernels import (
        fused_add_rmsnorm,
        int4_matmul,
        matmul,
        paged_decode,
        prefill_attention,
        softmax,
        vector_add,
    )
    from minillm.quant import codecs
    r = lambda *shape: torch.randn(*shape, device=device)  # noqa: E731
    codes, scale, zero = codecs.quantize_int4(r(70, 96), 32)
    x4 = (r(5, 96), codecs.pack_int4(codes), scale, zero, None)
    q, k, v, tables, lens = paged_case([1, 17, 40], 16, 8, 2, 32, torch.float32, device)
    starts, q_lens = torch.tensor([0, 1, 18], dtype=torch.int32, device=device), lens
    pq = r(58, 8, 32)
    cases = [
        ("vector add", vector_add.vector_add, vector_add.vector_add_spec, (r(3000), r(3000))),
        ("rmsnorm + residual", lambda *a: fused_add_rmsnorm.rmsnorm_residual(*a)[0],
         lambda *a: fused_add_rmsnorm.rmsnorm_residual_spec(*a)[0], (r(3, 200), r(3, 200), r(200), 1e-5)),
        ("softmax (online)", lambda x: softmax.softmax(x, block=64), softmax.softmax_spec, (r(3, 300) * 20,)),
        ("matmul", lambda a, b: matmul.matmul(a, b, 16, 16, 16), matmul.matmul_spec, (r(37, 70), r(70, 45))),
        ("int4 matmul", int4_matmul.int4_linear, int4_matmul.int4_linear_spec, x4),
        ("paged decode (split)", lambda *a: paged_decode.paged_decode_attention(*a, 16, splits=2),
         lambda *a: paged_decode.paged_decode_spec(*a, 16), (q, k, v, tables, lens)),
        ("prefill attention", lambda *a: prefill_attention.prefill_attention(*a, 16),
         lambda *a: prefill_attention.prefill_attention_spec(*a, 16), (pq, k, v, tables, starts, q_lens, lens)),
    ]
    rows = []
    for name, kernel, spec, args in cases:
        error = (kernel(*args).float() - spec(*args).float()).abs().max().item()
        rows.append({"kernel": name, "max abs error": f"{error:.1e}", "ok": error < 1e-3})
    return rows


def run(quick: bool = False, json_path: str | None = None, model: str | None = None) -> dict:
    model = model or "tiny"
    conditions = check_conditions()
    if not torch.cuda.is_available():
        print(f"{machine_line(conditions)}\nthe kernel figures need a CUDA GPU: here the kernels run in Triton's CPU "
              f"interpreter, whose speed means nothing. A correctness smoke pass instead:")
        rows = smoke(torch.device("cpu"))
        print_table(rows, "each kernel against its torch spec (CPU interpreter)")
        bad = [r["kernel"] for r in rows if not r["ok"]]
        if bad:
            raise RuntimeError(f"kernels that do not match their spec: {', '.join(bad)}")
        figures = {"device": "cpu", "model": model, "smoke": rows}
        write_json(json_path, "kernels", figures, conditions)
        return figures
    print(machine_line(conditions))
    figures = measure_gpu(torch.device("cuda"), quick, model)
    write_json(json_path, "kernels", figures, conditions)
    return figures


def e2e_decode(model: str, quick: bool) -> dict:
    """Decode tokens/s on each backend, same greedy tokens (batch 8, bf16)."""
    prompts = [f"def function_{i}(x):\n    return" for i in range(8)]
    params = SamplingParams(max_tokens=32 if quick else 128, temperature=0, ignore_eos=True)
    result = {}
    for backend in ("torch", "triton"):
        llm = LLM(model, attention_backend=backend)
        llm.generate(prompts[:1], SamplingParams(max_tokens=4), use_tqdm=False)  # warm-up: compiles the kernels
        outs = llm.generate(prompts, params, use_tqdm=False)
        tpot = statistics.median(o.metrics["tpot"] for o in outs)
        result[backend] = {"tokens_per_s": len(prompts) / tpot, "tokens": [o.token_ids for o in outs]}
    return {"model": model, "batch": len(prompts), "torch_tokens_per_s": result["torch"]["tokens_per_s"],
            "triton_tokens_per_s": result["triton"]["tokens_per_s"],
            "speedup": result["triton"]["tokens_per_s"] / result["torch"]["tokens_per_s"],
            "same_tokens": result["torch"]["tokens"] == result["triton"]["tokens"]}


def peaks(device) -> dict:
    """The device's measured peaks: a 1 GiB copy, an 8192^3 bf16 matmul."""
    return {"bandwidth": measure_bandwidth(device, mbytes=1024, repeats=10),
            "flops": measure_flops(device, torch.bfloat16, size=8192, repeats=10)}


def timed(fn, repeats: int) -> float:
    return median_time(fn, repeats, warmup=3, sync=torch.cuda.synchronize)


def row(name: str, shape: str, triton_s: float, torch_s: float, moved: float, flop: float, peak: dict) -> dict:
    """moved: bytes the kernel must read and write at least; flop: its arithmetic (0 if negligible)."""
    return {"kernel": name, "shape": shape, "triton us": triton_s * 1e6, "torch us": torch_s * 1e6,
            "speedup": torch_s / triton_s, "GB/s": moved / triton_s / 1e9,
            "of peak BW": moved / triton_s / peak["bandwidth"], "TFLOP/s": flop / triton_s / 1e12,
            "of peak FLOP/s": flop / triton_s / peak["flops"]}


def measure_gpu(device, quick: bool, model: str) -> dict:
    from minillm.cache.paged import paged_decode
    from minillm.kernels import fused_add_rmsnorm, int4_matmul, matmul, softmax, vector_add
    from minillm.kernels import paged_decode as decode
    from minillm.quant import codecs
    from minillm.quant.quantized_linear import int4_linear
    bf, reps = torch.bfloat16, 10 if quick else 30
    r = lambda *shape: torch.randn(*shape, device=device, dtype=bf)  # noqa: E731
    peak = peaks(device)
    print(f"peaks measured here: copy {peak['bandwidth'] / 1e9:,.0f} GB/s, bf16 matmul {peak['flops'] / 1e12:,.0f} "
          f"TFLOP/s")
    rows = []
    n = 2**26
    x, y = r(n), r(n)
    rows.append(row("vector add", f"{n:,}", timed(lambda: vector_add.vector_add(x, y), reps),
                    timed(lambda: x + y, reps), 3 * n * 2, n, peak))
    a, res, w = r(8192, 4096), r(8192, 4096), r(4096)
    rows.append(row("rmsnorm + residual", "8192 x 4096",
                    timed(lambda: fused_add_rmsnorm.rmsnorm_residual(a, res, w, 1e-5), reps),
                    timed(lambda: fused_add_rmsnorm.rmsnorm_residual_spec(a, res, w, 1e-5), reps),
                    4 * a.numel() * 2, 0, peak))
    for cols, block in ((4096, 4096), (65536, 4096)):
        s = r(8192 * 4096 // cols, cols)
        t_kernel = timed(partial(softmax.softmax, s, block=block), reps)
        t_torch = timed(partial(torch.softmax, s, -1), reps)
        rows.append(row("softmax" + (" (online)" if cols > block else ""), f"{s.shape[0]} x {cols}", t_kernel, t_torch,
                        2 * s.numel() * 2, 0, peak))
    m1, m2 = r(4096, 4096), r(4096, 4096)
    rows.append(row("matmul", "4096^3 bf16", timed(lambda: matmul.matmul(m1, m2), reps), timed(lambda: m1 @ m2, reps),
                    3 * m1.numel() * 2, 2 * 4096**3, peak))
    codes, scale, zero = codecs.quantize_int4(torch.randn(4096, 4096, device=device), 64)
    packed, wd = codecs.pack_int4(codes), r(4096, 4096)
    for batch in (1, 4, 16):
        xb = r(batch, 4096)
        moved = packed.numel() + scale.numel() * 5 + 2 * xb.numel() * 2
        t_fused = timed(partial(int4_matmul.int4_linear, xb, packed, scale, zero, None), reps)
        t_torch = timed(partial(int4_linear, xb, packed, scale, zero, None), reps)
        rows.append(row("int4 matmul", f"batch {batch}, 4096 x 4096, g64", t_fused, t_torch, moved,
                        2 * batch * 4096**2, peak))
        rows[-1]["vs dense bf16"] = timed(partial(F.linear, xb, wd), reps) / t_fused
    heads, kv_heads, d, bs = 32, 8, 128, 16
    for batch in (1, 8, 64) if quick else (1, 4, 16, 64):
        for ctx in (512, 8192) if quick else (512, 2048, 8192):
            q, k, v, tables, lens = paged_case([ctx] * batch, bs, heads, kv_heads, d, bf, device)
            k_blocks, v_blocks = k.view(-1, bs, kv_heads, d), v.view(-1, bs, kv_heads, d)
            flat = tables.long().flatten()
            t_kernel = timed(partial(decode.paged_decode_attention, q, k, v, tables, lens, bs, max_context=ctx), reps)
            t_torch = timed(partial(paged_decode, q, k_blocks, v_blocks, flat, ctx, None), reps)
            rows.append(row("paged decode", f"batch {batch}, context {ctx}", t_kernel, t_torch,
                            2 * k.numel() * 2, 4 * batch * heads * ctx * d, peak))
    print_table(rows, "Triton kernels vs torch (fractions of the peaks measured above)")
    e2e = e2e_decode(model, quick)
    print(f"\nend-to-end decode on {model}, batch {e2e['batch']}: torch backend {e2e['torch_tokens_per_s']:,.0f} "
          f"tok/s, triton backend {e2e['triton_tokens_per_s']:,.0f} tok/s ({e2e['speedup']:.2f}x); same greedy tokens: "
          f"{e2e['same_tokens']}")
    return {"device": torch.cuda.get_device_name(device), "peak_bandwidth": peak["bandwidth"],
            "peak_flops": peak["flops"], "kernels": rows, "end_to_end": e2e}
