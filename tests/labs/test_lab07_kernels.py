"""Grader of lab 07, Triton kernels, on Triton's CPU interpreter (or a GPU).

Oracles: the PyTorch specs of minillm's kernels (minillm/kernels/*.py), the engine's int4 codecs,
fixed cases computed by hand, and for 7.E the real engine with the notebook's paged decode kernel
against the engine with its own attention. Every buffer a kernel gets lies inside a larger one with
guard regions (minillm/kernels/guard.py): a read past a tensor leaks NaN into the output, a write
past it changes a guard. Inputs are seeded, of both signs; their shapes, the block sizes and eps are
drawn at random, with the last block partial (and, as a boundary, exactly full), and every output is
checked to be in its input's dtype (float32 and float16: the interpreter computes bfloat16 wrongly).
Shapes are small: the interpreter runs each program one after another.
"""
import contextlib
import random

import pytest

# Through minillm's runtime, not `import triton`: it sets TRITON_INTERPRET=1 before any kernel is defined.
pytest.importorskip("minillm.kernels.runtime", reason="the Triton kernels need the triton package (Linux only): "
                                                      "pip install -e '.[triton]'")

import torch  # noqa: E402
from triton.runtime.errors import InterpreterError  # noqa: E402

from minillm import LLM, SamplingParams  # noqa: E402
from minillm.kernels.fused_add_rmsnorm import rmsnorm_residual_spec  # noqa: E402
from minillm.kernels.guard import Guarded, guarded, no_nan  # noqa: E402
from minillm.kernels.int4_matmul import int4_linear_spec  # noqa: E402
from minillm.kernels.matmul import matmul_spec  # noqa: E402
from minillm.kernels.paged_decode import paged_decode_spec  # noqa: E402
from minillm.kernels.softmax import softmax_spec  # noqa: E402
from minillm.kernels.vector_add import vector_add_spec  # noqa: E402
from minillm.labkit import exercise  # noqa: E402
from minillm.labkit.fixtures import assert_close, one_thread, randn  # noqa: E402
from minillm.labkit.plug import calls, lab_components  # noqa: E402
from minillm.quant import codecs  # noqa: E402

EXERCISES = {"7.1": "vector_add", "7.2": "rmsnorm_residual", "7.3": "softmax", "7.4": "matmul",
             "7.5": "int4_linear", "7.6": "paged_decode_attention",
             "7.E": "your paged decode kernel in the real engine"}


ALLOCATORS = ("empty", "empty_like", "zeros", "zeros_like")
OUTPUT_GUARD = -31337.0  # not NaN: a stray store of a NaN read through a missing load mask must change it


@contextlib.contextmanager
def guarded_allocations():
    """Every tensor torch.empty / empty_like / zeros / zeros_like makes meanwhile is the inner view of a
    Guarded buffer, its pad at least as large as itself: a launcher's own output gets guard regions too
    (and a kernel writing past it writes into its guard, not into memory that belongs to someone else)."""
    made, originals = [], {name: getattr(torch, name) for name in ALLOCATORS}

    def guarding(allocate):
        def allocate_guarded(*args, **kwargs):
            like = allocate(*args, **kwargs)
            g = Guarded(like, pad=max(4096, 2 * like.numel()))
            if like.dtype.is_floating_point:
                g.buffer[:g.pad], g.buffer[g.pad + g.n:] = OUTPUT_GUARD, OUTPUT_GUARD
                g.guard_before, g.guard_after = g.buffer[:g.pad].clone(), g.buffer[g.pad + g.n:].clone()
            made.append(g)
            return g.inner
        return allocate_guarded

    for name, allocate in originals.items():
        setattr(torch, name, guarding(allocate))
    try:
        yield made
    finally:
        for name, allocate in originals.items():
            setattr(torch, name, allocate)


def run(fn, *args, **kwargs):
    """Call a launcher, its outputs guarded; fails if it wrote outside a tensor it allocated. An exception
    raised inside a kernel comes out of the interpreter wrapped in an InterpreterError: a NotImplementedError
    is unwrapped, so that a stub reads as "not implemented yet"."""
    try:
        with guarded_allocations() as made:
            result = fn(*args, **kwargs)
    except InterpreterError as e:
        if isinstance(e.__cause__, NotImplementedError):
            raise e.__cause__ from None
        raise
    for g in made:
        assert g.untouched(), (f"{fn.__name__} wrote outside the {tuple(g.inner.shape)} tensor it allocated (a store "
                               f"without its mask?)")
    return result


def assert_output(out, want: torch.Tensor, what: str, atol: float, rtol: float) -> None:
    """The values within the tolerance, and in the input's dtype (the spec's): assert_close compares values only."""
    assert_close(out, want, what, atol=atol, rtol=rtol)
    assert out.dtype == want.dtype, f"{what}: the output is {out.dtype}, not the input's dtype {want.dtype}"


def assert_in_bounds(what: str, *buffers: Guarded, outputs=()) -> None:
    for g in buffers:
        assert g.untouched(), f"{what}: something was written outside a {tuple(g.inner.shape)} tensor (a store " \
                              f"without its mask?)"
    assert no_nan(*outputs), f"{what}: NaN in the output: something was read from outside the inputs (a load " \
                             f"without its mask?)"


# -- 7.1 vector add ------------------------------------------------------------------------------
def vector_lengths(rng: random.Random, block: int) -> list[int]:
    """One length of each kind: a single element, less than a block, one block exactly, whole blocks
    exactly, and whole blocks with a partial last one."""
    return [1, rng.randint(2, block - 1), block, block * rng.randint(2, 3), block * rng.randint(1, 3) +
            rng.randint(1, block - 1)]


@exercise("7.1")
def test_vector_add_equals_the_spec_across_the_tail(lab):
    """seeded lengths (one element, under a block, one block exactly, whole blocks, whole blocks and a partial
    one) in seeded blocks of 16 to 1024, float32 and float16: x + y in x's dtype, inside guard regions"""
    rng = random.Random(701)
    with one_thread():
        for block in rng.sample([16, 64, 256, 1024], 4):
            for n in vector_lengths(rng, block):
                for dtype in (torch.float32, torch.float16):
                    x, y = guarded(randn(710 + n, n, scale=rng.uniform(0.5, 20)).to(dtype),
                                   randn(711 + n, n, scale=rng.uniform(0.5, 20)).to(dtype), pad=2048)
                    what = f"vector_add of {n} {dtype} elements, block {block}"
                    out = run(lab.vector_add, x.inner, y.inner, block=block)
                    assert_output(out, vector_add_spec(x.inner, y.inner), what, atol=0, rtol=0)
                    assert_in_bounds(what, x, y, outputs=[out])


@exercise("7.1")
def test_vector_add_fixed_case(lab):
    """[1.5, -2, 3, 0.25, -7] + [10, 20, -30, 0.5, 7] = [11.5, 18, -27, 0.75, 0] in blocks of 2 (three programs)"""
    x, y = guarded(torch.tensor([1.5, -2, 3, 0.25, -7]), torch.tensor([10.0, 20, -30, 0.5, 7]))
    out = run(lab.vector_add, x.inner, y.inner, block=2)
    what = "vector_add([1.5, -2, 3, 0.25, -7], [10, 20, -30, 0.5, 7], block=2)"
    assert_output(out, torch.tensor([11.5, 18, -27, 0.75, 0]), what, atol=0, rtol=0)
    assert_in_bounds(what, x, y, outputs=[out])


# -- 7.2 RMSNorm with the residual -----------------------------------------------------------------
def check_rmsnorm(lab, x: Guarded, residual: Guarded, weight: Guarded, eps: float, what: str, tol: float,
                  x_view: torch.Tensor | None = None, residual_view: torch.Tensor | None = None) -> None:
    """x_view, residual_view: the rows the kernel gets (strided views into x.inner, residual.inner), None: all."""
    x_in = x.inner if x_view is None else x_view
    r_in = residual.inner if residual_view is None else residual_view
    result = run(lab.rmsnorm_residual, x_in, r_in, weight.inner, eps)
    assert isinstance(result, tuple) and len(result) == 2, f"{what}: rmsnorm_residual must return (y, h)"
    y, h = result
    want_y, want_h = rmsnorm_residual_spec(x_in, r_in, weight.inner, eps)
    assert_output(h, want_h, f"{what}: h = x + residual", atol=0, rtol=0)
    assert_output(y, want_y, f"{what}: y", atol=tol, rtol=tol)
    assert_in_bounds(what, x, residual, weight, outputs=[y, h])


@exercise("7.2")
def test_rmsnorm_residual_equals_the_spec(lab):
    """(y, h) of seeded shapes (one row or several; hidden a power of two exactly, one more or less, odd) with a
    seeded eps equal the spec, inside guard regions"""
    rng = random.Random(702)
    with one_thread():
        for seed, hidden in enumerate([64, 65, 63, 37, 200]):
            rows = rng.choice([1, rng.randint(2, 6)])
            eps = 10 ** rng.uniform(-6, -2)
            x, r, w = guarded(randn(720 + seed, rows, hidden, scale=3), randn(725 + seed, rows, hidden),
                              randn(729 + seed, hidden), pad=512)
            check_rmsnorm(lab, x, r, w, eps, f"rmsnorm_residual of [{rows}, {hidden}] (float32), eps {eps:.3g}", 1e-5)


@exercise("7.2")
def test_rmsnorm_residual_uses_the_eps_it_is_given(lab):
    """rows of small values (mean square about 0.01) with eps drawn between 0.02 and 0.5: eps inside the square
    root, the value given, not a default"""
    rng = random.Random(7021)
    with one_thread():
        for seed in range(3):
            eps, hidden = rng.uniform(0.02, 0.5), rng.randint(20, 90)
            x, r, w = guarded(randn(736 + seed, 3, hidden, scale=0.07), randn(739 + seed, 3, hidden, scale=0.07),
                              randn(742 + seed, hidden), pad=512)
            check_rmsnorm(lab, x, r, w, eps, f"rmsnorm_residual of [3, {hidden}] with eps {eps:.4f}", 1e-5)


@exercise("7.2")
def test_rmsnorm_residual_reads_strided_rows(lab):
    """x a [4, 50] view of a [4, 72] matrix (row stride 72), the residual one of a [4, 61] matrix: each row is
    read at its own stride"""
    wide, r, w = guarded(randn(730, 4, 72, scale=2), randn(731, 4, 61), randn(732, 50), pad=512)
    with one_thread():
        check_rmsnorm(lab, wide, r, w, 1e-5, "rmsnorm_residual of x = wide[:, :50], residual = other[:, 11:]", 1e-5,
                      x_view=wide.inner[:, :50], residual_view=r.inner[:, 11:])


@exercise("7.2")
def test_rmsnorm_residual_in_float16(lab):
    """float16 rows: h exactly x + residual in float16, y float16 within its rounding of the spec"""
    with one_thread():
        for seed, (rows, hidden) in enumerate([(3, 96), (2, 45)]):
            x, r, w = guarded(randn(733 + seed, rows, hidden, scale=4).half(), randn(734 + seed, rows, hidden).half(),
                              randn(735 + seed, hidden).half(), pad=512)
            check_rmsnorm(lab, x, r, w, 1e-3, f"rmsnorm_residual of [{rows}, {hidden}] in float16", 2e-3)


# -- 7.3 softmax ---------------------------------------------------------------------------------
def check_softmax(lab, x: torch.Tensor, block: int, what: str, tol: float = 1e-5,
                  view=lambda inner: inner) -> None:
    """view: the rows the kernel gets, from the guarded copy of x (a strided view of it, say)."""
    g = Guarded(x, pad=1024)
    rows = view(g.inner)
    out = run(lab.softmax, rows, block=block)
    assert_output(out, softmax_spec(rows), what, atol=tol / 10, rtol=tol)
    assert_in_bounds(what, g, outputs=[out])


@exercise("7.3")
def test_softmax_equals_the_spec_in_one_block(lab):
    """rows of 1, 37, 64 (one block exactly) and 100 columns, each one block, values of both signs"""
    with one_thread():
        for seed, (rows, cols) in enumerate([(3, 37), (2, 100), (1, 1), (2, 64)]):
            check_softmax(lab, randn(740 + seed, rows, cols, scale=3), 4096, f"softmax of [{rows}, {cols}], one block")


@exercise("7.3")
def test_softmax_online_over_blocks(lab):
    """rows of 300 in blocks of 64 (the last one partial), the max growing block after block or in the first block;
    seeded rows of whole blocks exactly and of whole blocks and a partial one, in seeded blocks of 16 to 64"""
    rising = randn(745, 2, 300, scale=2) + torch.linspace(0, 12, 300)
    rng = random.Random(703)
    with one_thread():
        check_softmax(lab, rising, 64, "softmax of [2, 300] in blocks of 64, the max rising along the row")
        check_softmax(lab, rising.flip(1), 64, "softmax of [2, 300] in blocks of 64, the max in the first block")
        for seed in range(4):
            block = rng.choice([16, 32, 64])
            cols = block * rng.randint(2, 4) + (rng.randint(1, block - 1) if seed % 2 else 0)
            check_softmax(lab, randn(746 + seed, 3, cols, scale=3), block,
                          f"softmax of [3, {cols}] in blocks of {block}")


@exercise("7.3")
def test_softmax_survives_large_logits(lab):
    """logits up to about 250 (exp overflows float32 past 88): finite, and equal to the spec, in one block and online"""
    x = randn(747, 3, 150, scale=30) + torch.linspace(0, 200, 150)
    with one_thread():
        for block in (4096, 32):
            check_softmax(lab, x, block, f"softmax of logits up to {float(x.max()):.0f}, blocks of up to {block}")


@exercise("7.3")
def test_softmax_reads_strided_rows(lab):
    """x a [4, 45] view of a [4, 70] matrix (row stride 70), in one block and online in blocks of 16"""
    with one_thread():
        for block in (4096, 16):
            check_softmax(lab, randn(748, 4, 70, scale=3), block, f"softmax of wide[:, 20:65], blocks of up to {block}",
                          view=lambda inner: inner[:, 20:65])


@exercise("7.3")
def test_softmax_in_float16(lab):
    """float16 rows, in one block and online: the output float16, within its rounding of the spec"""
    with one_thread():
        for block in (4096, 32):
            check_softmax(lab, randn(749, 3, 90, scale=4).half(), block, f"softmax of [3, 90] in float16, blocks of "
                          f"up to {block}", tol=2e-3)


# -- 7.4 matmul ----------------------------------------------------------------------------------
def matmul_shapes(rng: random.Random, block_k: int) -> list[tuple[int, int, int]]:
    """(M, K, N) of each kind: one row (a decode), K shorter than one step, K whole steps exactly, K whole
    steps and a partial one; M and N never multiples of 16."""
    m, n = rng.choice([17, 23, 37, 45, 51]), rng.choice([19, 29, 41, 45])
    return [(1, block_k * 2 + rng.randint(1, block_k - 1), n), (m, rng.randint(3, block_k - 1), n),
            (m, block_k * rng.randint(1, 3), n), (m, block_k * rng.randint(1, 2) + rng.randint(1, block_k - 1), n)]


@exercise("7.4")
def test_matmul_equals_the_spec_across_tile_edges(lab):
    """seeded shapes (one row; K under one step, whole steps exactly, whole steps and a partial one) in seeded
    tiles of 16 to 64, float32 and float16: the spec's product in a's dtype, inside guard regions"""
    rng = random.Random(704)
    with one_thread():
        for dtype, tol in ((torch.float32, 1e-4), (torch.float16, 1e-2)):
            blocks = rng.choice([16, 32]), rng.choice([16, 32, 64]), rng.choice([16, 32])
            for seed, (m, k, n) in enumerate(matmul_shapes(rng, blocks[2])):
                a, b = guarded(randn(750 + seed, m, k).to(dtype), randn(751 + seed, k, n).to(dtype), pad=4096)
                out = run(lab.matmul, a.inner, b.inner, *blocks)
                what = f"matmul of [{m}, {k}] @ [{k}, {n}] ({dtype}), blocks {blocks}"
                assert_output(out, matmul_spec(a.inner, b.inner), what, atol=tol, rtol=tol)
                assert_in_bounds(what, a, b, outputs=[out])


@exercise("7.4")
def test_matmul_reads_transposed_operands(lab):
    """a and b as transposed views (strides (1, M) and (1, K)), default blocks (K = 40: a step of 32, one of 8);
    a as every other row of a matrix, b as every third column"""
    a, b = guarded(randn(752, 40, 33), randn(753, 21, 40), pad=4096)  # a.t(): [33, 40]; b.t(): [40, 21]
    with one_thread():
        out = run(lab.matmul, a.inner.t(), b.inner.t())
        what = "matmul of a.t() [33, 40] @ b.t() [40, 21]"
        assert_output(out, matmul_spec(a.inner.t(), b.inner.t()), what, atol=1e-4, rtol=1e-4)
        assert_in_bounds(what, a, b, outputs=[out])
        a, b = guarded(randn(754, 50, 37), randn(755, 37, 60), pad=4096)
        a_rows, b_cols = a.inner[::2], b.inner[:, ::3]  # [25, 37] (row stride 74), [37, 20] (column stride 3)
        out = run(lab.matmul, a_rows, b_cols, 16, 16, 16)
        what = "matmul of a[::2] [25, 37] @ b[:, ::3] [37, 20]"
        assert_output(out, matmul_spec(a_rows, b_cols), what, atol=1e-4, rtol=1e-4)
        assert_in_bounds(what, a, b, outputs=[out])


@exercise("7.4")
def test_matmul_fixed_case(lab):
    """[[1, 2, 3], [-4, 5, 6]] @ [[1, 0], [0, -1], [2, 2]] = [[7, 4], [8, 7]] in tiles of 16"""
    a, b = guarded(torch.tensor([[1.0, 2, 3], [-4, 5, 6]]), torch.tensor([[1.0, 0], [0, -1], [2, 2]]))
    out = run(lab.matmul, a.inner, b.inner, 16, 16, 16)
    what = "matmul([[1, 2, 3], [-4, 5, 6]], [[1, 0], [0, -1], [2, 2]]) in tiles of 16"
    assert_output(out, torch.tensor([[7.0, 4], [8, 7]]), what, atol=0, rtol=0)
    assert_in_bounds(what, a, b, outputs=[out])


# -- 7.5 int4 dequantize-matmul ------------------------------------------------------------------
def check_int4(lab, lead: tuple[int, ...], features_in: int, features_out: int, group: int, bias: bool, dtype,
               seed: int):
    """x: [*lead, features_in] (lead: the leading dims, maybe none)."""
    w = randn(seed, features_out, features_in)
    w[0] = w[0].abs()  # a row of one sign: zero point 0
    codes, scale, zero = codecs.quantize_int4(w, group)
    x, packed, s, z = guarded(randn(seed + 1, *lead, features_in).to(dtype), codecs.pack_int4(codes), scale, zero,
                              pad=4096)
    b = Guarded(randn(seed + 2, features_out).to(dtype)) if bias else None
    args = (x.inner, packed.inner, s.inner, z.inner, b.inner if bias else None)
    what = (f"int4_linear of x {list(lead) + [features_in]} ({dtype}) with W [{features_out}, {features_in}] in "
            f"groups of {group}, {'with' if bias else 'without'} a bias")
    with one_thread():
        out = run(lab.int4_linear, *args)
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    assert_output(out, int4_linear_spec(*args), what, atol=tol, rtol=1e-2 if dtype != torch.float32 else 1e-4)
    assert_in_bounds(what, x, packed, s, z, *([b] if bias else []), outputs=[out])


@exercise("7.5")
def test_int4_linear_equals_the_spec(lab):
    """x [3, 200] with W [70, 200] in groups of 40 (K and N cross the tiles), float32 and float16; seeded shapes
    and group sizes (one group, groups of an odd size, x with two leading dims or none), float32 and float16"""
    check_int4(lab, (3,), 200, 70, 40, False, torch.float32, 760)
    check_int4(lab, (3,), 200, 70, 40, False, torch.float16, 763)
    rng = random.Random(705)
    odd = [9, 11, 13]  # odd group sizes: every other group starts in the middle of a byte
    cases = [((2, 3), rng.randint(33, 70), 1), ((), 3 * rng.choice(odd), 3),
             ((rng.randint(17, 20),), 5 * rng.choice(odd), 5)]
    for case, (lead, features_in, groups) in enumerate(cases):
        dtype = (torch.float32, torch.float16)[case % 2]
        check_int4(lab, lead, features_in, rng.randint(33, 60), features_in // groups, case == 1, dtype, 770 + case)


@exercise("7.5")
def test_int4_linear_with_a_bias_and_an_odd_number_of_inputs(lab):
    """x [21, 45] with W [50, 45] in groups of 15 (the last byte of a row holds one code) and a bias"""
    check_int4(lab, (21,), 45, 50, 15, True, torch.float32, 766)


@exercise("7.5")
def test_int4_linear_fixed_case(lab):
    """codes [1, 2, 15, 0] packed as [0x21, 0x0F], scale 0.5, zero 1: W = [0, 0.5, 7, -0.5]; x = [1, 2, 3, 4] -> 20"""
    packed, scale, zero = guarded(torch.tensor([[0x21, 0x0F]], dtype=torch.uint8), torch.tensor([[0.5]]),
                                  torch.tensor([[1]], dtype=torch.uint8))
    x = Guarded(torch.tensor([[1.0, 2, 3, 4]]))
    out = run(lab.int4_linear, x.inner, packed.inner, scale.inner, zero.inner, None)
    what = "int4_linear of x [1, 2, 3, 4] with codes [1, 2, 15, 0], scale 0.5, zero point 1"
    assert_output(out, torch.tensor([[20.0]]), what, atol=1e-6, rtol=0)
    assert_in_bounds(what, x, packed, scale, zero, outputs=[out])


# -- 7.6 paged decode attention --------------------------------------------------------------------
def paged_pool(context_lens, block_size, kv_heads, d, dtype, seed, index_dtype=torch.int32):
    """-> (k_slots, v_slots [slots, kv_heads, d], block_tables [B, max_blocks] of index_dtype): each sequence's
    blocks scattered over the pool in shuffled order, unused slots NaN, tables padded with -1."""
    g = torch.Generator().manual_seed(seed)
    widths = [-(-n // block_size) for n in context_lens]
    num_blocks = sum(widths) + 2
    order = torch.randperm(num_blocks, generator=g).tolist()
    tables, k = [], torch.full((num_blocks * block_size, kv_heads, d), float("nan"))
    v = k.clone()
    for n, width in zip(context_lens, widths):
        table, order = order[:width], order[width:]
        tables.append(table + [-1] * (max(widths) - width))
        t = torch.arange(n)
        slots = torch.tensor(table)[t // block_size] * block_size + t % block_size
        k[slots] = torch.randn(n, kv_heads, d, generator=g)
        v[slots] = torch.randn(n, kv_heads, d, generator=g) * 2
    return k.to(dtype), v.to(dtype), torch.tensor(tables, dtype=index_dtype)


CONTEXTS = [1, 17, 32, 5, 70, 33]  # one token, a block and one, one tile exactly, several tiles and a partial one


@exercise("7.6")
def test_paged_decode_equals_the_spec(lab):
    """mixed contexts over shuffled block tables, GQA ratios 1, 3 and 4, blocks of 16 and of 5 (contexts a whole
    number of blocks and not), int32 and int64 tables, float32 and float16 (the output in q's dtype), inside
    guard regions"""
    d = 20
    precision = {torch.float32: (1e-5, 1e-4), torch.float16: (2e-3, 2e-3)}  # (atol, rtol)
    with one_thread():
        for case, (heads, kv_heads) in enumerate(((3, 3), (6, 2), (8, 2))):
            for block_size, index_dtype in ((16, torch.int32), (5, (torch.int64, torch.int32)[case % 2])):
                dtype = (torch.float32, torch.float16)[(case + block_size) % 2]
                atol, rtol = precision[dtype]
                k, v, tables = paged_pool(CONTEXTS, block_size, kv_heads, d, dtype, seed=heads + block_size,
                                          index_dtype=index_dtype)
                lens = torch.tensor(CONTEXTS, dtype=index_dtype)
                q, gk, gv, gt, gl = guarded(randn(770 + heads, len(CONTEXTS), heads, d, scale=2).to(dtype), k, v,
                                            tables, lens, pad=3 * k.numel())
                what = (f"paged_decode_attention with {heads} query heads over {kv_heads} kv heads, blocks of "
                        f"{block_size}, contexts {CONTEXTS}, {dtype}, {index_dtype} tables")
                out = run(lab.paged_decode_attention, q.inner, gk.inner, gv.inner, gt.inner, gl.inner, block_size,
                          max_context=max(CONTEXTS))
                want = paged_decode_spec(q.inner, k, v, tables, lens, block_size)
                assert_output(out, want, what, atol=atol, rtol=rtol)
                assert_in_bounds(what, q, gk, gv, gt, gl, outputs=[out])


@exercise("7.6")
def test_paged_decode_writes_only_its_rows_of_out(lab):
    """float16: sequence b reads q[rows[b]] and writes out[rows[b]]; the other rows of out keep their values"""
    heads, kv_heads, d, bs = 4, 1, 32, 8
    k, v, tables = paged_pool(CONTEXTS, bs, kv_heads, d, torch.float16, seed=7)
    lens = torch.tensor(CONTEXTS, dtype=torch.int32)
    q = randn(778, 9, heads, d).half()  # the decode rows among others, in another order
    rows = torch.tensor([8, 0, 3, 7, 2, 5], dtype=torch.int32)
    out, gk, gv = Guarded(torch.full_like(q, 7.0)), *guarded(k, v, pad=3 * k.numel())
    run(lab.paged_decode_attention, q, gk.inner, gv.inner, tables, lens, bs, rows=rows, out=out.inner)
    want = paged_decode_spec(q[rows.long()], k, v, tables, lens, bs)
    what = "paged_decode_attention with rows [8, 0, 3, 7, 2, 5] of a 9-row q and out (float16)"
    assert_close(out.inner[rows.long()], want, what, atol=2e-3, rtol=2e-3)
    others = [r for r in range(9) if r not in rows.tolist()]
    assert (out.inner[others] == 7).all(), f"{what}: rows {others} of out belong to no sequence, yet were written"
    assert_in_bounds(what, out, gk, gv, outputs=[out.inner])


@exercise("7.6")
def test_paged_decode_fixed_case(lab):
    """one head, two tokens of context in block 2 of a pool of three blocks of 4: softmax([0, -1.75]) of their values"""
    k, v = torch.full((12, 1, 4), float("nan")), torch.full((12, 1, 4), float("nan"))  # [slots, kv_heads, d]
    k[8], v[8] = torch.tensor([[0.0, 0, 0, 0]]), torch.tensor([[100.0, 100, 100, 100]])
    k[9], v[9] = torch.tensor([[1.0, -2, 3, 0.5]]), torch.tensor([[4.0, -5, 6, 0.25]])
    q, gk, gv, table, lens = guarded(torch.tensor([[[0.5, 1, -1, 2]]]), k, v, torch.tensor([[2]], dtype=torch.int32),
                                     torch.tensor([2], dtype=torch.int32), pad=64)
    out = run(lab.paged_decode_attention, q.inner, gk.inner, gv.inner, table.inner, lens.inner, 4)
    what = "paged_decode_attention of q [0.5, 1, -1, 2] over keys [0, 0, 0, 0] and [1, -2, 3, 0.5] in slots 8 and 9"
    p = torch.tensor([0.0, (0.5 - 2 - 3 + 1) / 2]).softmax(0)  # q . k / sqrt(4)
    want = p[0] * v[8] + p[1] * v[9]  # [1, 4]
    assert_close(out, want.view(1, 1, 4), what, atol=1e-5, rtol=1e-5)
    assert_in_bounds(what, q, gk, gv, table, lens, outputs=[out])


# -- 7.E the kernel inside the engine --------------------------------------------------------------
PROMPTS = ["def fibonacci(n):", "import os\nimport sys\n\nclass Stack:\n    def push(self, x):", "x ="]


@exercise("7.E", timeout=180)
def test_your_paged_decode_runs_the_real_engine(lab):
    ("tiny (GQA ratio 2) on attention_backend='triton' with your paged decode kernel generates the reference "
     "engine's greedy tokens for three prompts of different lengths, in blocks of 8")
    components = lab_components(lab, labs=["07"])
    greedy = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)
    engine = dict(block_size=8, num_kv_blocks=48)
    want = [o.token_ids for o in LLM("tiny", **engine).generate(PROMPTS, greedy, use_tqdm=False)]
    llm = LLM("tiny", attention_backend="triton", components=components, **engine)
    got = [o.token_ids for o in llm.generate(PROMPTS, greedy, use_tqdm=False)]
    for i, (g, w) in enumerate(zip(got, want)):
        assert g == w, (f"prompt {i} ({PROMPTS[i].splitlines()[0]!r}): the engine with your paged decode kernel "
                        f"generated {g}, the reference engine {w}")
    assert calls(components)["paged_decode"] > 0, "the engine never called your paged_decode_attention"
