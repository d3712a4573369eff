"""Each Triton kernel against the PyTorch spec beside it, on Triton's CPU interpreter (or a GPU).

Every buffer lives inside a larger one with guard regions (minillm/kernels/guard.py): a kernel that
reads past its tensors leaks the guards' NaN into its output, one that writes past them changes a
guard. Shapes are small but never multiples of the block sizes, so every mask is exercised.
"""
import os
import subprocess
import sys

import pytest

# Through minillm's runtime, not `import triton`: it sets TRITON_INTERPRET=1 before any kernel is defined.
pytest.importorskip("minillm.kernels.runtime", reason="the Triton kernels need the triton package (Linux only): "
                                                      "pip install -e '.[triton]'")

import torch  # noqa: E402

from minillm.kernels.guard import Guarded, guarded, no_nan  # noqa: E402
from minillm.kernels.runtime import INTERPRETED, tl, triton  # noqa: E402

# Needs the compiled kernels (a GPU): `pytest -m gpu` runs these on a machine that has one.
BF16_DOT = [pytest.mark.gpu,
            pytest.mark.skipif(INTERPRETED, reason="Triton's interpreter has no bfloat16 arithmetic (numpy has no "
                                                   "bfloat16): tl.dot on bfloat16 tiles computes on raw bits; the "
                                                   "kernels that upcast to float32 first are tested in bfloat16")]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
DOT_DTYPES = [torch.float32, torch.float16, pytest.param(torch.bfloat16, marks=BF16_DOT)]
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}
# The interpreter casts float32 to bfloat16 toward zero (a GPU rounds to nearest): one bf16 step apart.
EXACT = {torch.float32: 0, torch.float16: 0, torch.bfloat16: 2**-7}


def randn(*shape, dtype=torch.float32, seed=0, scale=1.0):
    """Both signs, reproducible."""
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale).to(dtype)


def assert_close(got, want, dtype):
    tol = TOL[dtype]
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)


def assert_in_bounds(*buffers: Guarded, outputs=()):
    for i, g in enumerate(buffers):
        assert g.untouched(), f"buffer {i} ({tuple(g.inner.shape)}): a guard region was written"
    assert no_nan(*outputs), "NaN in the output: a guard region was read"


# -- vector add, and the proof that the guards catch a missing mask ----------------------------------

@pytest.mark.parametrize("n", [1, 1000, 2049])
@pytest.mark.parametrize("dtype", DTYPES)
def test_vector_add_matches_spec(n, dtype):
    from minillm.kernels.vector_add import vector_add, vector_add_spec
    x, y = guarded(randn(n, dtype=dtype), randn(n, dtype=dtype, seed=1))
    out = vector_add(x.inner, y.inner, block=512)
    torch.testing.assert_close(out, vector_add_spec(x.inner, y.inner), atol=0, rtol=EXACT[dtype])
    assert_in_bounds(x, y, outputs=[out])


@triton.jit
def add_with_unmasked_store(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offsets, mask=offsets < n, other=0.0)
    y = tl.load(y_ptr + offsets, mask=offsets < n, other=0.0)
    tl.store(out_ptr + offsets, x + y)  # the bug: the last block writes past the end


@triton.jit
def row_sum_with_unmasked_load(x_ptr, out_ptr, cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    x = tl.load(x_ptr + row * cols + tl.arange(0, BLOCK))  # the bug: reads past the row (into the next, or the guard)
    tl.store(out_ptr + row, tl.sum(x, axis=0))


def test_guards_catch_a_missing_store_mask():
    x, y = guarded(randn(100), randn(100, seed=1))
    out = Guarded(torch.zeros(100))
    add_with_unmasked_store[(triton.cdiv(100, 64),)](x.inner, y.inner, out.inner, 100, BLOCK=64)
    torch.testing.assert_close(out.inner, x.inner + y.inner)  # inside the tensor the result is even right
    assert not out.untouched(), "the store past the end went unnoticed"


def test_guards_catch_a_missing_load_mask():
    x = Guarded(randn(3, 50))
    out = torch.empty(3)
    row_sum_with_unmasked_load[(3,)](x.inner, out, 50, BLOCK=64)
    assert not no_nan(out), "the read past the end went unnoticed"


# -- RMSNorm with the residual add, softmax ------------------------------------------------------------

@pytest.mark.parametrize("rows, hidden", [(1, 64), (5, 200)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rmsnorm_residual_matches_spec(rows, hidden, dtype):
    from minillm.kernels.fused_add_rmsnorm import rmsnorm_residual, rmsnorm_residual_spec
    x, res, w = guarded(randn(rows, hidden, dtype=dtype, scale=3), randn(rows, hidden, dtype=dtype, seed=1),
                        randn(hidden, dtype=dtype, seed=2))
    y, h = rmsnorm_residual(x.inner, res.inner, w.inner, 1e-5)
    y_ref, h_ref = rmsnorm_residual_spec(x.inner, res.inner, w.inner, 1e-5)
    torch.testing.assert_close(h, h_ref, atol=0, rtol=EXACT[dtype])
    assert_close(y, y_ref, dtype)
    assert_in_bounds(x, res, w, outputs=[y, h])


@pytest.mark.parametrize("rows, cols, block", [(3, 37, 4096), (2, 300, 64)])  # one block; online over 5 blocks
@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_matches_spec_and_survives_large_logits(rows, cols, block, dtype):
    from minillm.kernels.softmax import softmax, softmax_spec
    x = Guarded(randn(rows, cols, dtype=dtype, scale=30) + torch.linspace(0, 200, cols).to(dtype))  # exp would overflow
    out = softmax(x.inner, block=block)
    assert_close(out, softmax_spec(x.inner), dtype)
    assert_in_bounds(x, outputs=[out])


# -- matmul and int4 dequantize-matmul ---------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DOT_DTYPES)
def test_matmul_matches_spec_across_tile_edges(dtype):
    from minillm.kernels.matmul import matmul, matmul_spec
    a, b = guarded(randn(37, 70, dtype=dtype), randn(70, 45, dtype=dtype, seed=1))
    out = matmul(a.inner, b.inner, block_m=16, block_n=32, block_k=16)
    torch.testing.assert_close(out.float(), matmul_spec(a.inner, b.inner).float(), atol=1e-2 if dtype != torch.float32
                               else 1e-4, rtol=1e-2)
    assert_in_bounds(a, b, outputs=[out])


def test_matmul_reads_strided_operands():
    from minillm.kernels.matmul import matmul, matmul_spec
    a, b = randn(40, 20), randn(33, 20, seed=1)
    torch.testing.assert_close(matmul(a, b.t(), 16, 16, 16), matmul_spec(a, b.t()), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("rows, features_in, features_out, group, bias", [
    (3, 200, 150, 40, False),  # decode-like: one tile of rows; K and N cross the interpreter's 128-wide tiles
    (21, 45, 70, 15, True),    # odd input size: the last byte holds one code; a bias
])
@pytest.mark.parametrize("dtype", DOT_DTYPES)
def test_int4_linear_matches_spec(rows, features_in, features_out, group, bias, dtype):
    from minillm.kernels.int4_matmul import int4_linear, int4_linear_spec
    from minillm.quant import codecs
    codes, scale, zero = codecs.quantize_int4(randn(features_out, features_in, seed=3), group)
    x, packed, s, z = guarded(randn(rows, features_in, dtype=dtype), codecs.pack_int4(codes), scale, zero)
    b = Guarded(randn(features_out, dtype=dtype, seed=4)) if bias else None
    out = int4_linear(x.inner, packed.inner, s.inner, z.inner, b.inner if bias else None)
    want = int4_linear_spec(x.inner, packed.inner, s.inner, z.inner, b.inner if bias else None)
    torch.testing.assert_close(out.float(), want.float(), atol=3e-2 if dtype != torch.float32 else 1e-4, rtol=1e-2)
    assert_in_bounds(x, packed, s, z, *([b] if bias else []), outputs=[out])


# -- the paged KV cache: store, decode attention, prefill attention -------------------------------------

def paged_pool(context_lens, block_size, kv_heads, d, dtype, seed=0):
    """-> (k_slots, v_slots [slots, kv_heads, d], block_tables int32 [B, max_blocks]). Each sequence's
    blocks are scattered over the pool in shuffled order; every slot no sequence holds is NaN (so a
    kernel that reads a token past a context leaks it), and tables are padded with -1."""
    g = torch.Generator().manual_seed(seed)
    widths = [-(-n // block_size) for n in context_lens]
    num_blocks = sum(widths) + 2
    order = torch.randperm(num_blocks, generator=g).tolist()
    tables, k, v = [], torch.full((num_blocks * block_size, kv_heads, d), float("nan")), None
    v = k.clone()
    for n, width in zip(context_lens, widths):
        table, order = order[:width], order[width:]
        tables.append(table + [-1] * (max(widths) - width))
        t = torch.arange(n)
        slots = torch.tensor(table)[t // block_size] * block_size + t % block_size
        k[slots] = torch.randn(n, kv_heads, d, generator=g)
        v[slots] = torch.randn(n, kv_heads, d, generator=g)
    return k.to(dtype), v.to(dtype), torch.tensor(tables, dtype=torch.int32)


def test_store_kv_writes_each_token_to_its_slot_and_skips_negative_slots():
    from minillm.kernels.store_kv import store_kv, store_kv_spec
    k, v = randn(7, 3, 20), randn(7, 3, 20, seed=1)
    slots = torch.tensor([12, 3, 39, -1, 0, 21, 22])
    pools = [randn(40, 3, 20, seed=2), randn(40, 3, 20, seed=3)]
    want = [p.clone() for p in pools]
    store_kv_spec(k, v, *want, slots)
    gk, gv, gkc, gvc, gs = guarded(k, v, *pools, slots)
    store_kv(gk.inner, gv.inner, gkc.inner, gvc.inner, gs.inner)
    torch.testing.assert_close(gkc.inner, want[0], atol=0, rtol=0)
    torch.testing.assert_close(gvc.inner, want[1], atol=0, rtol=0)
    assert_in_bounds(gk, gv, gkc, gvc, gs, outputs=[gkc.inner, gvc.inner])


CONTEXTS = [1, 17, 40, 5, 33]  # mixed lengths: one token, a block and one, several blocks


@pytest.mark.parametrize("heads, kv_heads", [(3, 3), (6, 2), (8, 2)])  # GQA ratios 1, 3, 4
@pytest.mark.parametrize("block_size, splits", [(16, None), (5, 3)])    # one pass; split over the context
def test_paged_decode_matches_spec(heads, kv_heads, block_size, splits):
    from minillm.kernels.paged_decode import paged_decode_attention, paged_decode_spec
    d = 20
    k, v, tables = paged_pool(CONTEXTS, block_size, kv_heads, d, torch.float32)
    lens = torch.tensor(CONTEXTS, dtype=torch.int32)
    q, gk, gv, gt, gl = guarded(randn(len(CONTEXTS), heads, d, seed=5), k, v, tables, lens,
                                pad=block_size * kv_heads * d)
    out = paged_decode_attention(q.inner, gk.inner, gv.inner, gt.inner, gl.inner, block_size, splits=splits)
    torch.testing.assert_close(out, paged_decode_spec(q.inner, k, v, tables, lens, block_size), atol=1e-5, rtol=1e-5)
    assert_in_bounds(q, gk, gv, gt, gl, outputs=[out])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_paged_decode_in_half_precision_writes_only_its_rows(dtype):
    from minillm.kernels.paged_decode import paged_decode_attention, paged_decode_spec
    heads, kv_heads, d, bs = 4, 1, 32, 8
    k, v, tables = paged_pool(CONTEXTS, bs, kv_heads, d, dtype, seed=1)
    lens = torch.tensor(CONTEXTS, dtype=torch.int32)
    q = randn(9, heads, d, dtype=dtype, seed=6)  # the decode rows among others, in another order
    rows = torch.tensor([8, 0, 3, 7, 2], dtype=torch.int32)
    out = Guarded(torch.full_like(q, 7.0))
    paged_decode_attention(q, k, v, tables, lens, bs, rows=rows, out=out.inner, splits=2)
    want = paged_decode_spec(q[rows.long()], k, v, tables, lens, bs)
    assert_close(out.inner[rows.long()], want, dtype)
    others = [r for r in range(9) if r not in rows.tolist()]
    assert (out.inner[others] == 7).all(), "rows of no decode sequence were written"
    assert_in_bounds(out, outputs=[out.inner])


PREFILLS = [(5, 5), (20, 37), (1, 9), (33, 33)]  # (new queries, context): whole prompts, a cached prefix, one token


@pytest.mark.parametrize("heads, kv_heads, block_size, dtype", [
    *[(h, kv, bs, torch.float32) for h, kv in [(3, 3), (6, 2), (8, 2)] for bs in (16, 5)],  # GQA 1, 3, 4
    (8, 2, 5, torch.float16),
])
def test_prefill_attention_matches_spec(heads, kv_heads, block_size, dtype):
    from minillm.kernels.prefill_attention import prefill_attention, prefill_attention_spec
    d = 20
    q_lens, lens = [n for n, _ in PREFILLS], [c for _, c in PREFILLS]
    k, v, tables = paged_pool(lens, block_size, kv_heads, d, dtype, seed=2)
    starts = torch.tensor([0, *torch.tensor(q_lens).cumsum(0)[:-1].tolist()], dtype=torch.int32)
    meta = [starts, torch.tensor(q_lens, dtype=torch.int32), torch.tensor(lens, dtype=torch.int32)]
    q, gk, gv, gt, *gmeta = guarded(randn(sum(q_lens), heads, d, dtype=dtype, seed=7), k, v, tables, *meta,
                                    pad=block_size * kv_heads * d)
    out = prefill_attention(q.inner, gk.inner, gv.inner, gt.inner, *(g.inner for g in gmeta), block_size)
    want = prefill_attention_spec(q.inner, k, v, tables, *meta, block_size)
    assert_close(out, want, dtype)
    assert_in_bounds(q, gk, gv, gt, *gmeta, outputs=[out])


def run_without_triton_interpret(code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.subprocess
@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the kernels are compiled, whatever is imported first")
def test_importing_minillm_first_lets_triton_be_imported_anywhere_after_it():
    """`import minillm` chooses the interpreter, so a learner's `import triton` (or transformers importing it) in
    a later cell does no harm: a kernel that calls triton's own functions (tl.sum) runs and is right."""
    run = run_without_triton_interpret(
        "import minillm, torch, triton\n"
        "from minillm.kernels.fused_add_rmsnorm import rmsnorm_residual, rmsnorm_residual_spec\n"
        "x, r, w = torch.randn(5, 200), torch.randn(5, 200), torch.randn(200)\n"
        "got, want = rmsnorm_residual(x, r, w, 1e-5), rmsnorm_residual_spec(x, r, w, 1e-5)\n"
        "assert all(torch.allclose(g, e, atol=1e-5) for g, e in zip(got, want))\n")
    assert run.returncode == 0, run.stderr[-2000:]


@pytest.mark.subprocess
@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the kernels are compiled, whatever is imported first")
def test_triton_imported_before_minillm_is_refused_with_how_to_recover():
    run = run_without_triton_interpret("import triton\nimport minillm.kernels.fused_add_rmsnorm\n")
    assert run.returncode != 0
    assert "triton was imported before minillm" in run.stderr and "restart the kernel" in run.stderr.lower()
