# %% [markdown]
# # Lab 07 · Triton kernels
#
# **Time:** about 140 minutes in all (each section's heading gives its share). **You need:** lab 00
# (the roofline), lab 01 (RMSNorm, softmax, attention), lab 03 (block tables) and lab 06 (the packed
# int4 format).
#
# **See also:** the visualizer's **Kernels** page (`make app`: which elements each program of a
# kernel loads and stores, and, on a GPU, each kernel's bandwidth), and the Triton kernels section of
# [docs/engine.md](../docs/engine.md#triton-kernels) (the engine's kernels and how to turn them on).
#
# Every operation of the engine so far was a PyTorch call, and each call reads its inputs from the
# GPU's memory and writes its output back. A **kernel** is the program the GPU runs for one such
# operation. Writing your own lets you *fuse*: do several steps on data while it sits in fast
# on-chip memory, so that it crosses the slow memory bus once instead of once per step. Lab 00
# showed that a decode step waits on memory; fused kernels are how engines stop wasting it.
#
# [Triton](https://triton-lang.org) writes GPU kernels in Python. You describe what **one program**
# does to **one block** of data, and launch a grid of programs; Triton turns each block operation
# into the GPU's threads, vector registers and tensor-core instructions.
#
# You will climb a ladder of six kernels, each beside its plain-PyTorch **spec**:
# vector add → fused residual + RMSNorm → softmax (stable, then online) → tiled matmul with a K loop
# → int4 dequantize-matmul → paged decode attention. The last one runs **inside the engine**, in
# place of the engine's own kernel, and must give the same tokens.
#
# ## Learning objectives
# By the end you can
# 1. explain program ids, blocks, masks and pointer arithmetic, and draw which elements each program
#    of a kernel loads and stores;
# 2. write kernels that fuse a chain of element-wise and reduction steps (residual add + RMSNorm);
# 3. make a softmax numerically stable, and compute it online over blocks (the heart of
#    FlashAttention);
# 4. tile a matmul, walk its K dimension in a loop, and handle the last partial tile;
# 5. unpack and dequantize int4 weights in registers, inside the matmul;
# 6. write paged decode attention: a query per sequence, its keys found through its block table,
#    one program per kv head serving all its query heads (GQA);
# 7. catch out-of-bounds accesses with guard regions, and say what a GPU would measure;
# 8. predict and measure the engine's fused CPU kernels at SmolLM2's shapes against the bytes they
#    must move, and, on a GPU, your own kernels.
#
# ## How this lab works (and why it runs without a GPU)
# Write code only in the exercise cells (they contain `raise NotImplementedError`), keeping names
# and signatures. Run each `check(...)` cell for feedback; `make grade LAB=07` grades the notebook.
#
# There is no GPU here, so the kernels run in **Triton's interpreter** (`TRITON_INTERPRET=1`, set by
# `import minillm`, which must come before Triton is imported: restart the kernel if a cell imported
# triton first, and the kernels' runtime tells you so): it runs the programs of a grid one after the
# other, in numpy. The results are those of a GPU; the speed is not, so the notebook times your
# kernels only where a GPU is present; on the CPU it times the engine's fused C++ kernels instead.
# The exercises' shapes are small for that reason, but never multiples of
# the block sizes: that is where kernels go wrong. Each exercise's launcher has the signature of
# the engine's, in `minillm/kernels/` (read it after you finish).

# %% tags=["setup"]
import torch
from torch import Tensor

from minillm.kernels.runtime import INTERPRETED, check_device, next_pow2, tl, triton
from minillm.labkit import check

# %%
import plotly.graph_objects as go
from plotly.subplots import make_subplots
from triton.runtime.interpreter import interpreter_builder

from minillm import LLM, SamplingParams
from minillm.config import Components
from minillm.kernels.guard import Guarded
from minillm.perf import PROFILES, OpCost, predicted_time
from minillm.quant import codecs

torch.set_num_threads(1)
print("interpreted (no GPU):", INTERPRETED)

# %% [markdown]
# ## Programs, blocks, masks, pointers (~10 min)
#
# A kernel is a function decorated with `@triton.jit`. It is launched on a **grid**:
# `kernel[(programs,)](args...)` runs `programs` instances of it. Inside, `tl.program_id(0)` says
# which one this is, and from it each program computes *which part of the data is its own*.
#
# Tensors arrive as **pointers** to their first element. `x_ptr + offsets` with
# `offsets = pid * BLOCK + tl.arange(0, BLOCK)` is a block of `BLOCK` pointers, and
# `tl.load(x_ptr + offsets)` loads all of them at once into a block of values. A 2-D block is built
# from two ranges by broadcasting, as in numpy: `rows[:, None] * stride + cols[None, :]`. A
# tensor's **strides** (elements to skip per step along each dimension, `x.stride()`) turn indices
# into offsets, so a kernel can read a row of a wider matrix, or a transposed one, without a copy.
#
# Block sizes are compile-time constants (`tl.constexpr`) and powers of two; data sizes are not. The
# last block sticks out past the end, so every load and store takes a **mask**:
# `tl.load(ptrs, mask=offsets < n, other=0.0)` loads only where the mask is true (`other` fills the
# rest) and `tl.store(ptrs, values, mask=...)` writes only there. Forget it, and the kernel reads
# or overwrites whatever lies after the tensor: on a GPU, often silently.
#
# (Triton also has **block pointers**, `tl.make_block_ptr(base, shape, strides, offsets,
# block_shape, order)`, which carry the shape and strides themselves and are advanced with
# `tl.advance`; with `boundary_check` they mask for you. The kernels here compute their offsets by
# hand, which shows exactly what a block pointer does.)
#
# To **see** what a kernel touches, the next cell records every load and store the interpreter
# performs: for each program, the addresses it read and wrote, mapped back to the elements of the
# tensors we name. You will use it after each exercise.

# %%
def record_accesses(launch, **tensors: Tensor) -> dict:
    """Run launch() and record, for each named tensor, which program loaded and stored each element.

    -> {(name, "load" | "store"): float tensor of the tensor's shape holding the number of the last
    program that touched each element (NaN: none)} and {"outside": addresses no named tensor holds}.
    Programs are numbered in the order the interpreter runs them. Name contiguous tensors only.
    """
    events, original = [], (interpreter_builder.create_masked_load, interpreter_builder.create_masked_store)

    def load(ptrs, mask, *rest):
        events.append(("load", interpreter_builder.grid_idx, ptrs.data[mask.data].astype("int64")))
        return original[0](ptrs, mask, *rest)

    def store(ptrs, value, mask, *rest):
        events.append(("store", interpreter_builder.grid_idx, ptrs.data[mask.data].astype("int64")))
        return original[1](ptrs, value, mask, *rest)

    interpreter_builder.create_masked_load, interpreter_builder.create_masked_store = load, store
    try:
        launch()
    finally:
        interpreter_builder.create_masked_load, interpreter_builder.create_masked_store = original
    programs = {idx: i for i, idx in enumerate(dict.fromkeys(idx for _, idx, _ in events))}
    maps = {(name, kind): torch.full(t.shape, float("nan")) for name, t in tensors.items()
            for kind in ("load", "store")}
    outside = 0
    for kind, idx, addresses in events:
        addresses = torch.from_numpy(addresses)
        claimed = torch.zeros(len(addresses), dtype=torch.bool)
        for name, t in tensors.items():
            start, size = t.data_ptr(), t.element_size()
            inside = (addresses >= start) & (addresses < start + t.numel() * size)
            maps[(name, kind)].view(-1)[(addresses[inside] - start) // size] = programs[idx]
            claimed |= inside
        outside += int((~claimed).sum())
    return {**maps, "outside": outside}


def access_heatmap(z: Tensor, title: str, xaxis: str = "column", yaxis: str = "row") -> go.Heatmap:
    """One access map (a vector is shown as one row), program numbers as colours, untouched blank."""
    z = z.reshape(1, -1) if z.dim() == 1 else z
    return go.Heatmap(z=z.tolist(), colorscale="Turbo", xgap=1, ygap=1, name=title,
                      colorbar=dict(title="program"), hovertemplate=f"{yaxis} %{{y}}, {xaxis} %{{x}}: "
                      "program %{z}<extra>" + title + "</extra>")


# %% [markdown]
# ## Exercise 7.1 · Vector add: the first kernel (~10 min)
#
# `out = x + y` for two vectors of `n` elements. Each program owns one block of `BLOCK`
# consecutive elements, program 0 the first. How many programs must the grid have so that every
# element has an owner? With 40 elements in blocks of 16 it takes three, and the third is partly
# past the end: it must mask. Work out the general count before you write the launcher.
#
# Add in float32 (`.to(tl.float32)` after loading) and store in the output's dtype:
# `out_ptr.dtype.element_ty` is the element type a pointer points to. Each exercise below has the
# same three parts: the **spec** (plain PyTorch, what the kernel must compute), the **kernel**, and
# the **launcher**, a Python function with the engine's signature that checks its inputs,
# allocates the output and launches the grid.

# %% exercise="7.1"
def vector_add_spec(x: Tensor, y: Tensor) -> Tensor:
    """x, y: [n] -> [n]"""
    return (x.float() + y.float()).to(x.dtype)


@triton.jit
def vector_add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """One program's share of the sum: its BLOCK elements, those below n.

    out[i] = x[i] + y[i] (definition)
    """
    ### BEGIN SOLUTION
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)  # [BLOCK]
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask).to(tl.float32)
    y = tl.load(y_ptr + offsets, mask=mask).to(tl.float32)
    tl.store(out_ptr + offsets, (x + y).to(out_ptr.dtype.element_ty), mask=mask)
    ### END SOLUTION


def vector_add(x: Tensor, y: Tensor, block: int = 1024) -> Tensor:
    """The elementwise sum of two vectors on the vector_add_kernel, added in float32.

    out[i] = x[i] + y[i] (definition)

    x, y: [n], same dtype, on one device -> out: a new [n] tensor in x's dtype; x and y are not written.
    block: elements per program (a power of two); every element has exactly one owning program.
    Raises ValueError for shapes that are not two vectors of one length (the checks are given).
    """
    if x.shape != y.shape or x.dim() != 1:
        raise ValueError(f"vector_add takes two vectors of the same length, got {tuple(x.shape)} and {tuple(y.shape)}")
    check_device(x, y)
    x, y = x.contiguous(), y.contiguous()
    ### BEGIN SOLUTION
    out = torch.empty_like(x)
    vector_add_kernel[(triton.cdiv(x.numel(), block),)](x, y, out, x.numel(), BLOCK=block)
    return out
    ### END SOLUTION


# %% [markdown]
# <details><summary>Hint 1: a nudge</summary>
#
# The kernel: which elements are this program's? Its program id and a range of `BLOCK` lanes say it.
# Then: which of those lanes exist? The launcher: an output to fill, and a grid to launch.
# </details>
#
# <details><summary>Hint 2: the idea</summary>
#
# A lane exists when its offset is below `n`: that comparison is the mask, for both loads and the
# store. The grid is a tuple with one entry, the number of blocks it takes to cover `n` elements,
# rounded *up* (Triton has a helper for exactly that division). Arguments are passed in the
# kernel's order; the `constexpr` block size by keyword.
# </details>
#
# <details><summary>Hint 3: the last step</summary>
#
# Load both inputs as float32, add, convert to the output pointer's element type, store under the
# same mask. The output is a new, uninitialised tensor like `x`.
# </details>


# %% [markdown]
# Which program touches what: 40 elements in blocks of 16 make three programs, and the third has
# only 8 elements to load. Its other 8 lanes are masked off: no read, no write.

# %%
x_demo, y_demo = torch.randn(40), torch.randn(40)
out_demo = torch.empty(40)
seen = record_accesses(lambda: vector_add_kernel[(3,)](x_demo, y_demo, out_demo, 40, BLOCK=16),
                       x=x_demo, y=y_demo, out=out_demo)
fig = make_subplots(rows=2, cols=1, subplot_titles=("x: loaded by", "out: stored by"), vertical_spacing=0.25)
fig.add_trace(access_heatmap(seen[("x", "load")], "x"), row=1, col=1)
fig.add_trace(access_heatmap(seen[("out", "store")], "out"), row=2, col=1)
fig.update_xaxes(title_text="element")
fig.update_yaxes(showticklabels=False)
fig.update_layout(title="vector add, n = 40, BLOCK = 16: three programs", height=300)
fig.show()
print("accesses outside x, y and out:", seen["outside"])

# %%
check("7.1")

# %% [markdown]
# ### A missing mask, caught
#
# Here is the same kernel with the store's mask forgotten. Inside the tensor its result is even
# right, so comparing outputs would not catch it. The graded tests put every buffer inside a
# larger one whose **guard regions** before and after hold NaN (`minillm/kernels/guard.py`): a
# stray read leaks NaN into the output, a stray write changes a guard. The access map shows
# where the last program wrote.

# %%
@triton.jit
def add_without_store_mask(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offsets, mask=offsets < n, other=0.0)
    y = tl.load(y_ptr + offsets, mask=offsets < n, other=0.0)
    tl.store(out_ptr + offsets, x + y)  # the bug: no mask, so the last program writes 8 elements too many


out_guarded = Guarded(torch.zeros(40), pad=12)  # [12 guard | 40 out | 12 guard] in one buffer
seen = record_accesses(lambda: add_without_store_mask[(3,)](x_demo, y_demo, out_guarded.inner, 40, BLOCK=16),
                       buffer=out_guarded.buffer)
print("output right inside the tensor:", torch.allclose(out_guarded.inner, x_demo + y_demo))
print("guards untouched:", out_guarded.untouched())
fig = go.Figure(access_heatmap(seen[("buffer", "store")], "buffer"))
for edge in (11.5, 51.5):
    fig.add_vline(x=edge, line_dash="dot", line_color="black")
fig.update_layout(title="stores without a mask: the last program writes into the guard after out",
                  xaxis_title="element of the guarded buffer (guard | out | guard)", height=220)
fig.update_yaxes(showticklabels=False)
fig.show()

# %% [markdown]
# ## Exercise 7.2 · RMSNorm with the residual add fused in (~15 min)
#
# In every decoder layer, `x = x + attn(...)` is followed by the next RMSNorm. Unfused, that is
# three passes over the row: read x and the residual and write their sum; read the sum for its
# mean square; read it again to normalise and write. Fused, one program per row reads `x` and the
# residual **once** and writes both results once:
#
# $$h = x + r,\qquad y = \frac{h}{\sqrt{\tfrac1H \sum_j h_j^2 + \varepsilon}} \odot w \quad\to (y, h).$$
#
# The whole row is one block (`BLOCK = next_pow2(hidden)`); masked lanes load 0, which adds
# nothing to the sum of squares, but divide by `hidden`, not by `BLOCK`. Rows may be strided
# (a row of a wider matrix): offset row `r` by `r * stride`. The order of rounding matters for
# float16 models: store `h` in the model's dtype, then compute the statistics from *that* rounded
# `h` in float32, and round the normalised row to the model's dtype before multiplying by the gain
# (as `minillm/layers/rmsnorm.py` and Hugging Face's Llama do).

# %% exercise="7.2"
def rmsnorm_residual_spec(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """x, residual: [rows, hidden]; weight: [hidden] -> (y [rows, hidden], h = x + residual) (definition)"""
    h = x + residual
    normed = (h.float() * torch.rsqrt(h.float().pow(2).mean(-1, keepdim=True) + eps)).to(h.dtype)
    return (weight.float() * normed.float()).to(h.dtype), h


@triton.jit
def rmsnorm_residual_kernel(x_ptr, res_ptr, w_ptr, y_ptr, h_ptr, hidden, eps,
                            stride_x, stride_r, stride_y, stride_h, BLOCK: tl.constexpr):
    """One program per row: both results stored, each row read once.

    h = x + res, y = h / sqrt(mean(h^2) + eps) * w (definition)
    """
    ### BEGIN SOLUTION
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    r = tl.load(res_ptr + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
    h = (x + r).to(h_ptr.dtype.element_ty)  # the residual stream keeps the model's dtype
    tl.store(h_ptr + row * stride_h + cols, h, mask=mask)
    h = h.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(h * h, axis=0) / hidden + eps)  # masked lanes add 0
    normed = (h * rstd).to(y_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * stride_y + cols, (normed * w).to(y_ptr.dtype.element_ty), mask=mask)
    ### END SOLUTION


def rmsnorm_residual(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """The fused residual add and RMSNorm on rmsnorm_residual_kernel.

    x, residual: [rows, hidden] (rows may be strided, columns contiguous); weight: [hidden]; eps > 0
    -> (y, h), two new [rows, hidden] tensors in x's dtype, with the spec's roundings (definition above).
    One program per row, the whole row in one block of lanes (a power of two, at least hidden).
    No input is written. Raises ValueError for mismatched shapes (the checks are given).
    """
    if x.shape != residual.shape or x.dim() != 2 or weight.shape != x.shape[1:]:
        raise ValueError(f"rmsnorm_residual takes x and residual [rows, hidden] and weight [hidden], got "
                         f"{tuple(x.shape)}, {tuple(residual.shape)} and {tuple(weight.shape)}")
    check_device(x, residual, weight)
    if x.stride(1) != 1 or residual.stride(1) != 1:
        x, residual = x.contiguous(), residual.contiguous()
    rows, hidden = x.shape
    ### BEGIN SOLUTION
    y, h = torch.empty_like(x), torch.empty_like(x)
    rmsnorm_residual_kernel[(rows,)](x, residual, weight.contiguous(), y, h, hidden, eps, x.stride(0),
                                     residual.stride(0), y.stride(0), h.stride(0), BLOCK=next_pow2(hidden))
    return y, h
    ### END SOLUTION


# %% [markdown]
# <details><summary>Hint 1: a nudge</summary>
#
# One program, one row: where does row `r` of each tensor start? Not at `r * hidden` when rows
# are strided. Which lanes of the block are real columns?
# </details>
#
# <details><summary>Hint 2: the idea</summary>
#
# The kernel receives each tensor's row stride; the launcher passes them, in the kernel's order, and
# a grid with one program per row. Masked lanes should load 0 so that they add nothing to the sum of
# squares, and the mean divides by the real number of columns. Round `h` to the model's dtype
# before the statistics, as the concept says.
# </details>
#
# <details><summary>Hint 3: the last step</summary>
#
# The lane count is the next power of two of `hidden` (the runtime imports a helper for it). Two
# outputs to allocate, both like `x`.
# </details>


# %% [markdown]
# Five rows of 24 (a block of 32 lanes), read out of a matrix 30 columns wide: one program per row,
# and the 6 columns each row skips are never read.

# %%
wide = torch.randn(5, 30)
x_rows, res_rows, w_rows = wide[:, :24], torch.randn(5, 24), torch.randn(24)
seen = record_accesses(lambda: rmsnorm_residual(x_rows, res_rows, w_rows, 1e-5), wide=wide)
fig = go.Figure(access_heatmap(seen[("wide", "load")], "wide"))
fig.update_layout(title="rmsnorm_residual reads x = wide[:, :24]: one program per row", xaxis_title="column of wide",
                  yaxis_title="row", height=260)
fig.update_yaxes(autorange="reversed")
fig.show()

# %%
check("7.2")

# %% [markdown]
# ## Exercise 7.3 · Softmax: stable, then online (~15 min)
#
# $$\mathrm{softmax}(x)_i = \frac{e^{x_i - m}}{\sum_j e^{x_j - m}},\qquad m = \max_j x_j .$$
#
# Subtracting the row's max changes nothing mathematically and everything numerically: `exp(89)`
# already overflows float32 to `inf`, and `inf / inf` is NaN. With `m` subtracted every exponent is
# at most 0, and the sum is at least 1.
#
# A row longer than one block needs its max before its sum, which seems to take three passes. The
# **online softmax** (Milakov & Gimelshein, 2018) does max and sum in one pass over the blocks:
# keep a running max `m` and a running sum `s` of `exp(x - m)`; when a block raises the max to
# `m'`, the terms already summed were computed against the old max, so rescale them:
#
# $$m' = \max(m, \max_{\text{block}} x),\qquad s' = s\, e^{m - m'} + \sum_{\text{block}} e^{x - m'} .$$
#
# A second pass writes `exp(x - m) / s`. Start from `m = -inf`, `s = 0` (then `e^{m - m'} = 0`).
# Masked lanes load `-inf`, whose `exp` is 0. One program per row; the blocks have
# `min(next_pow2(cols), block)` lanes, so a row of up to `block` columns is a single block.

# %% exercise="7.3"
def softmax_spec(x: Tensor) -> Tensor:
    """x: [rows, cols] -> [rows, cols], computed in float32, returned in x's dtype (definition)"""
    return torch.softmax(x.float(), dim=-1).to(x.dtype)


@triton.jit
def softmax_kernel(x_ptr, out_ptr, cols, stride_x, stride_out, BLOCK: tl.constexpr):
    """One program per row: an online pass for (max, sum), a second pass writing exp(x - max) / sum."""
    ### BEGIN SOLUTION
    row = tl.program_id(0)
    x_row, out_row = x_ptr + row * stride_x, out_ptr + row * stride_out
    offsets = tl.arange(0, BLOCK)
    m = -float("inf")
    s = 0.0
    for start in range(0, cols, BLOCK):
        mask = start + offsets < cols
        x = tl.load(x_row + start + offsets, mask=mask, other=-float("inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
        m = m_new
    for start in range(0, cols, BLOCK):
        mask = start + offsets < cols
        x = tl.load(x_row + start + offsets, mask=mask, other=-float("inf")).to(tl.float32)
        tl.store(out_row + start + offsets, (tl.exp(x - m) / s).to(out_ptr.dtype.element_ty), mask=mask)
    ### END SOLUTION


def softmax(x: Tensor, block: int = 4096) -> Tensor:
    """Row softmax on softmax_kernel, numerically stable, online over blocks for long rows.

    x: [rows, cols] (rows may be strided) -> a new [rows, cols] tensor in x's dtype, computed in float32;
    finite for logits far past exp's float32 range. x is not written.
    block: the most lanes per block (a power of two): a row of up to block columns is one block, a longer
    one is walked in blocks of block lanes. One program per row.
    """
    if x.dim() != 2:
        raise ValueError(f"softmax takes a matrix [rows, cols], got shape {tuple(x.shape)}")
    check_device(x)
    if x.stride(1) != 1:
        x = x.contiguous()
    rows, cols = x.shape
    ### BEGIN SOLUTION
    out = torch.empty_like(x)
    softmax_kernel[(rows,)](x, out, cols, x.stride(0), out.stride(0), BLOCK=min(next_pow2(cols), block))
    return out
    ### END SOLUTION


# %% [markdown]
# <details><summary>Hint 1: a nudge</summary>
#
# Two passes over the row, each a loop over its blocks. The first keeps two running numbers; the
# second writes. What must a lane past the end of the row load so that it changes neither the max
# nor the sum?
# </details>
#
# <details><summary>Hint 2: the idea</summary>
#
# Start the running max at minus infinity and the sum at 0. Each block: its own max, the new running
# max, the old sum rescaled to the new max, plus this block's terms against the new max. Masked lanes
# load minus infinity: their exponential is 0 and they never win the max.
# </details>
#
# <details><summary>Hint 3: the last step</summary>
#
# The block's lane count: the smaller of the row's length rounded up to a power of two and `block`.
# One program per row; pass the row strides.
# </details>


# %% [markdown]
# Logits of a few hundred are common in attention scores before scaling, and in a model's last
# layer. Without the max subtracted:

# %%
big = torch.tensor([[10.0, 95.0, 100.0, 3.0]])
print("exp(x) / sum(exp(x)):", (big.exp() / big.exp().sum()).tolist())
print("your softmax:        ", softmax(big).tolist())
print("online over blocks of 2 lanes:", softmax(big, block=2).tolist())

# %%
check("7.3")

# %% [markdown]
# ## Exercise 7.4 · Tiled matmul with a K loop (~15 min)
#
# `C = A @ B` with `A: [M, K]`, `B: [K, N]`. Each program computes one `[BLOCK_M, BLOCK_N]` tile of
# `C`, on a 2-D grid: `tl.program_id(0)` picks the tile's rows, `tl.program_id(1)` its columns. It
# walks K in steps of `BLOCK_K`: at each step it loads a `[BLOCK_M, BLOCK_K]` tile of A and a
# `[BLOCK_K, BLOCK_N]` tile of B and accumulates their product (`tl.dot`) in a float32
# accumulator. Every tile of A loaded is used `BLOCK_N` times, every tile of B `BLOCK_M` times:
# that reuse, out of fast memory, is what makes a matmul compute-bound (lab 00).
#
# K is rarely a multiple of `BLOCK_K`. Loop over `range(0, K, BLOCK_K)` (the last step is a
# partial tile) and mask the K dimension of both loads with `other=0.0`, so the lanes past K add
# nothing. Mask M and N too, and the store. Pass `input_precision="ieee"` to `tl.dot`, so float32
# stays float32 (GPUs otherwise round it to tf32). Use the strides: A or B may be transposed views.

# %% exercise="7.4"
def matmul_spec(a: Tensor, b: Tensor) -> Tensor:
    """a: [M, K]; b: [K, N] -> [M, N], accumulated in float32, returned in a's dtype (definition)"""
    return (a.float() @ b.float()).to(a.dtype)


@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """One program per [BLOCK_M, BLOCK_N] tile of C, looping over K in steps of BLOCK_K."""
    ### BEGIN SOLUTION
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] rows of C
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N] columns of C
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(a_ptr + rm[:, None] * stride_am + rk[None, :] * stride_ak,
                    mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)  # [BLOCK_M, BLOCK_K]
        b = tl.load(b_ptr + rk[:, None] * stride_bk + rn[None, :] * stride_bn,
                    mask=(rk[:, None] < K) & (rn[None, :] < N), other=0.0)  # [BLOCK_K, BLOCK_N]
        acc = tl.dot(a, b, acc, input_precision="ieee")
    tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, acc.to(c_ptr.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))
    ### END SOLUTION


def matmul(a: Tensor, b: Tensor, block_m: int = 64, block_n: int = 64, block_k: int = 32) -> Tensor:
    """C = A @ B on matmul_kernel.

    a: [M, K]; b: [K, N], same dtype and device, any strides (transposed views included)
    -> a new [M, N] tensor in a's dtype, accumulated in float32; a and b are not written.
    block_m, block_n, block_k: the tile sizes, powers of two, at least 16 (tl.dot's smallest tile); every
    tile of C has exactly one program. Raises ValueError for shapes that do not multiply (given).
    """
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0] or a.dtype != b.dtype:
        raise ValueError(f"matmul takes a [M, K] and b [K, N] of one dtype, got {tuple(a.shape)} {a.dtype} and "
                         f"{tuple(b.shape)} {b.dtype}")
    check_device(a, b)
    (m, k), n = a.shape, b.shape[1]
    ### BEGIN SOLUTION
    c = torch.empty(m, n, dtype=a.dtype, device=a.device)
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    matmul_kernel[grid](a, b, c, m, n, k, *a.stride(), *b.stride(), *c.stride(),
                        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k)
    return c
    ### END SOLUTION


# %% [markdown]
# <details><summary>Hint 1: a nudge</summary>
#
# A program's tile of C: its rows come from one program id, its columns from the other. What does
# it need from A and from B at each step along K, and what happens at the last, partial step?
# </details>
#
# <details><summary>Hint 2: the idea</summary>
#
# A float32 accumulator of the tile's shape; a loop over K in steps of the K tile; at each step a
# 2-D load of A's tile and of B's, each masked on both its dimensions (lanes past K load 0 and add
# nothing); accumulate their product in IEEE float32; store masked on M and N. Offsets use the
# strides, never the shapes, so transposed views work.
# </details>
#
# <details><summary>Hint 3: the last step</summary>
#
# The launcher: the output, a 2-D grid that covers M with row tiles and N with column tiles (rounded
# up, as in 7.1), and the six strides in the kernel's order.
# </details>


# %% [markdown]
# What one program reads: `C` is 40 × 40 in tiles of 16, so 3 × 3 programs, and K = 40 is two
# full steps of 16 and a partial one of 8. Below, the elements of A and B that program (1, 2)
# loads (the tile of C in row band 1, column band 2), coloured by the step of its K loop.

# %%
a_demo, b_demo, c_demo = torch.randn(40, 40), torch.randn(40, 40), torch.empty(40, 40)


def launch_one_program():
    """Program (1, 2) alone: shift the pointers to its tile and launch a grid of one."""
    matmul_kernel[(1, 1)](a_demo[16:], b_demo[:, 32:], c_demo[16:, 32:], 40 - 16, 40 - 32, 40,
                          *a_demo.stride(), *b_demo.stride(), *c_demo.stride(), BLOCK_M=16, BLOCK_N=16, BLOCK_K=16)


seen = record_accesses(launch_one_program, a=a_demo, b=b_demo)
a_steps, b_steps = torch.full((40, 40), float("nan")), torch.full((40, 40), float("nan"))
step_of_k = (torch.arange(40) // 16).float()  # [K]: the K step that covers each k
read_a, read_b = ~seen[("a", "load")].isnan(), ~seen[("b", "load")].isnan()
a_steps[read_a] = step_of_k.expand(40, 40)[read_a]
b_steps[read_b] = step_of_k[:, None].expand(40, 40)[read_b]
fig = make_subplots(rows=1, cols=2, subplot_titles=("A [M, K]: rows 16..31", "B [K, N]: columns 32..39"))
fig.add_trace(go.Heatmap(z=a_steps.tolist(), colorscale="Viridis", zmin=0, zmax=2, xgap=1, ygap=1,
                         colorbar=dict(title="K step")), row=1, col=1)
fig.add_trace(go.Heatmap(z=b_steps.tolist(), colorscale="Viridis", zmin=0, zmax=2, xgap=1, ygap=1,
                         showscale=False), row=1, col=2)
fig.update_yaxes(autorange="reversed")
fig.update_xaxes(title_text="k", row=1, col=1)
fig.update_xaxes(title_text="n", row=1, col=2)
fig.update_yaxes(title_text="m", row=1, col=1)
fig.update_yaxes(title_text="k", row=1, col=2)
fig.update_layout(title="matmul program (1, 2): what it loads at each step of its K loop", height=380)
fig.show()
print("c_demo's tile equals A @ B there:", torch.allclose(c_demo[16:32, 32:], (a_demo @ b_demo)[16:32, 32:], atol=1e-5))

# %% [markdown]
# The last step (yellow) is only 8 wide: its other 8 lanes are masked, and load 0. Program (1, 2)'s
# tile of C is also cut: only 8 of its 16 columns exist.

# %%
check("7.4")

# %% [markdown]
# ## Exercise 7.5 · int4 dequantize fused into the matmul (~15 min)
#
# Lab 06's `int4_linear` rebuilt the whole float weight in memory for every call: compare its time
# with the float layer's in your run of lab 06. Fused, the packed codes are read and unpacked **tile by tile,
# in registers**, right before `tl.dot`: the float weight never exists in memory, and a
# memory-bound decode reads 4.6 bits per weight instead of 16.
#
# The engine's format (`minillm/kernels/int4_format.py`, lab 06's packing): `W: [out, in]` becomes
# codes 0..15, two a byte along a row, the **even** input in the **low** nibble; a float32 scale and
# a uint8 zero point per group of `group_size` consecutive inputs of a row:
#
# $$W_{n,k} = (q_{n,k} - z_{n,\lfloor k/g \rfloor})\; s_{n,\lfloor k/g \rfloor},\qquad
#   q_{n,k} = (\text{byte}_{n,\lfloor k/2 \rfloor} \gg 4\,(k \bmod 2))\ \&\ \mathtt{0xF} .$$
#
# `y = x @ W^T + bias`. The tiling and the K loop are those of 7.4 with `B = W^T`: a program
# computes a tile of rows of `y` by a tile of output features, and at each K step builds the
# `[BLOCK_N, BLOCK_K]` tile of `W` it needs from the bytes: input `k` of a row sits in byte `k // 2`
# of that row (so two neighbouring lanes load the same byte), and which nibble is its own depends on
# whether `k` is even. Each lane also needs the scale and zero point of its own group. Shift in a
# wide integer type, not in uint8, and subtract the zero point in float. The tile sizes are yours
# to choose (powers of two, at least 16).

# %% exercise="7.5"
def int4_linear_spec(x: Tensor, packed: Tensor, scale: Tensor, zero: Tensor, bias: Tensor | None) -> Tensor:
    """The operation, in PyTorch (definition)

    x: [n, in]; packed: uint8 [out, ceil(in / 2)]; scale, zero: [out, in // group_size]; bias: [out] -> [n, out]
    """
    k = x.shape[-1]
    codes = torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(packed.shape[0], -1)[:, :k]  # [out, in]
    group = torch.arange(k) // (k // scale.shape[1])                                             # [in]
    w = (codes.float() - zero[:, group].float()) * scale[:, group]                               # [out, in]
    return torch.nn.functional.linear(x, w.to(x.dtype), bias)


@triton.jit
def int4_matmul_kernel(x_ptr, q_ptr, s_ptr, z_ptr, b_ptr, y_ptr, M, N, K, group_size,
                       stride_xm, stride_xk, stride_qn, stride_sn, stride_zn, stride_ym, stride_yn,
                       HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """One program per [BLOCK_M, BLOCK_N] tile of y, W dequantized a tile at a time, in registers.

    y = x @ dequant(W)^T + b (definition)
    """
    ### BEGIN SOLUTION
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] rows of x and y
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N] output features: rows of W
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)  # [BLOCK_K] input features
        x = tl.load(x_ptr + rm[:, None] * stride_xm + rk[None, :] * stride_xk,
                    mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)  # [BLOCK_M, BLOCK_K]
        w_mask = (rn[:, None] < N) & (rk[None, :] < K)  # [BLOCK_N, BLOCK_K]
        byte = tl.load(q_ptr + rn[:, None] * stride_qn + (rk // 2)[None, :], mask=w_mask, other=0).to(tl.int32)
        code = (byte >> ((rk % 2) * 4)[None, :]) & 0xF  # even k: the low nibble, odd k: the high one
        group = (rk // group_size)[None, :]
        scale = tl.load(s_ptr + rn[:, None] * stride_sn + group, mask=w_mask, other=0.0)
        zero = tl.load(z_ptr + rn[:, None] * stride_zn + group, mask=w_mask, other=0).to(tl.float32)
        w = (code.to(tl.float32) - zero) * scale  # [BLOCK_N, BLOCK_K]: the dequantized tile, in registers
        acc = tl.dot(x, tl.trans(w.to(x.dtype)), acc, input_precision="ieee")
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :] * stride_yn, acc.to(y_ptr.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))
    ### END SOLUTION


def int4_linear(x: Tensor, packed: Tensor, scale: Tensor, zero: Tensor, bias: Tensor | None) -> Tensor:
    """lab 06's int4_linear on int4_matmul_kernel, W in the engine's packed int4 format.

    y = x @ W^T + bias (definition)

    x: [..., in], any leading dimensions (none included); packed: uint8 [out, in / 2 rounded up]; scale: float32
    [out, groups]; zero: uint8 [out, groups], groups dividing in; bias: [out] or None -> [..., out] in x's dtype,
    the float weight never built in memory. No input is written. Shape errors raise ValueError (given).
    """
    k = x.shape[-1]
    n, groups = scale.shape
    if packed.shape != (n, (k + 1) // 2) or zero.shape != scale.shape or groups < 1 or k % groups:
        raise ValueError(f"int4_linear: x [..., {k}] needs packed [out, {(k + 1) // 2}] and scale, zero [out, groups] "
                         f"with groups dividing {k}; got packed {tuple(packed.shape)}, scale {tuple(scale.shape)}, "
                         f"zero {tuple(zero.shape)}")
    check_device(x, packed, scale, zero, bias)
    x2 = x.reshape(-1, k)  # [M, in]
    m = x2.shape[0]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)  # [M, out]
    ### BEGIN SOLUTION
    grid = (triton.cdiv(m, 16), triton.cdiv(n, 32))
    int4_matmul_kernel[grid](x2, packed, scale, zero, bias if bias is not None else scale, y, m, n, k, k // groups,
                             x2.stride(0), x2.stride(1), packed.stride(0), scale.stride(0), zero.stride(0),
                             y.stride(0), y.stride(1), HAS_BIAS=bias is not None, BLOCK_M=16, BLOCK_N=32, BLOCK_K=32)
    ### END SOLUTION
    return y.view(*x.shape[:-1], n)


# %% [markdown]
# <details><summary>Hint 1: a nudge</summary>
#
# Start from your 7.4 kernel. Only B's tile changes: instead of loading floats, you load bytes and
# turn them into the dequantized tile of `W`, then multiply `x`'s tile by its transpose.
# </details>
#
# <details><summary>Hint 2: the idea</summary>
#
# For the lanes `k` of the tile: the byte index is `k` halved (rounded down), the shift is 0 for an
# even `k` and 4 for an odd one, and a 4-bit mask keeps the nibble. The group of lane `k` is `k`
# divided by the group size: load the scale and zero point at that column of each row. The bias is
# added to the accumulator only when the `constexpr` flag says there is one.
# </details>
#
# <details><summary>Hint 3: the last step</summary>
#
# The launcher: a 2-D grid over the rows of `x` (flattened to 2-D, given) and the output features,
# in tiles of your choosing, and the group size from the scale's shape. Without a bias, any tensor
# can stand in for its pointer: the flag keeps the kernel from reading it.
# </details>


# %% [markdown]
# The bytes one K step of one program reads: a tile of 32 output features × 32 inputs is
# 32 × 16 bytes of codes plus a scale and a zero point per group, against 32 × 32 × 4 bytes for
# float32 weights.

# %%
w_demo = torch.randn(70, 96)
codes_demo, scale_demo, zero_demo = codecs.quantize_int4(w_demo, 32)
packed_demo = codecs.pack_int4(codes_demo)
x4 = torch.randn(3, 96)
seen = record_accesses(lambda: int4_linear(x4, packed_demo, scale_demo, zero_demo, None), packed=packed_demo)
fig = go.Figure(access_heatmap(seen[("packed", "load")], "packed"))
fig.update_layout(title="int4_linear: which program loads each byte of the packed weight [70, 48]",
                  xaxis_title="byte (two inputs each)", yaxis_title="output feature", height=380)
fig.update_yaxes(autorange="reversed")
fig.show()
print("equals lab 06's formula:", torch.allclose(int4_linear(x4, packed_demo, scale_demo, zero_demo, None),
                                                 int4_linear_spec(x4, packed_demo, scale_demo, zero_demo, None),
                                                 atol=1e-4))

# %%
check("7.5")

# %% [markdown]
# ## Exercise 7.6 · Paged decode attention (~25 min)
#
# The decode step of lab 03: each sequence has **one** new query token, attending over its whole
# context, whose keys and values lie in the paged pool, scattered over blocks. Token `t` of
# sequence `b` lies in slot
#
# $$\text{slot} = \text{table}[b,\ \lfloor t / bs \rfloor] \cdot bs + t \bmod bs ,$$
#
# and the kernel reads it **there**: no gather into a contiguous copy, no padding to the longest
# sequence. (`k_slots, v_slots: [slots, kv_heads, d]` are one layer's pool, with the same strides.)
#
# The grid is `(B, kv_heads)`. **GQA**: `heads` query heads share `kv_heads` K/V heads, query head
# `h` using kv head `h // group` (`group = heads // kv_heads`). So one program serves kv head `kvh`
# and all its `group` query heads `kvh * group + g`: it reads each key and value once for the whole
# group, a `[GROUP, D]` block of queries (`GROUP = next_pow2(group)`, the extra lanes masked).
#
# The program walks its context in tiles of `BLOCK_N` tokens (a tile may span several blocks: look
# up each token's block), and runs 7.3's online softmax over the tiles, per query head, with the
# output accumulated alongside:
#
# $$s = \frac{q\,K_{\text{tile}}^\top}{\sqrt d},\quad m' = \max(m, \max s),\quad
#   \alpha = e^{m - m'},\quad p = e^{s - m'},$$
# $$\text{acc}' = \alpha\,\text{acc} + p\,V_{\text{tile}},\qquad \ell' = \alpha\,\ell + \textstyle\sum p ,
#   \qquad \text{out} = \text{acc} / \ell .$$
#
# Tokens past the context (`t >= context_lens[b]`) must score `-inf`, and their loads must be
# masked: their slots belong to no one, or to another sequence. Write the two products as
# broadcasts and sums over a dimension rather than `tl.dot`, since `GROUP` may be below `tl.dot`'s 16.
# Query and output row of sequence `b` is `rows[b]`: the engine
# puts the decode rows among the prefill rows of one flattened batch, and passes `out` to fill.

# %% exercise="7.6"
def paged_decode_spec(q: Tensor, k_slots: Tensor, v_slots: Tensor, block_tables: Tensor, context_lens: Tensor,
                      block_size: int) -> Tensor:
    """q: [B, heads, d]; k_slots, v_slots: [slots, kv_heads, d]; block_tables: [B, max_blocks];
    context_lens: [B] -> [B, heads, d]. Token t of sequence b: slot table[b, t // bs] * bs + t % bs. (definition)"""
    out = torch.empty_like(q)
    group = q.shape[1] // k_slots.shape[1]
    for b, length in enumerate(context_lens.tolist()):
        t = torch.arange(length)
        slots = block_tables[b, t // block_size].long() * block_size + t % block_size  # [length]
        k = k_slots[slots].float().repeat_interleave(group, dim=1)                       # [length, heads, d]
        v = v_slots[slots].float().repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,thd->ht", q[b].float(), k) / q.shape[-1] ** 0.5        # [heads, length]
        out[b] = torch.einsum("ht,thd->hd", scores.softmax(-1), v).to(q.dtype)
    return out


BLOCK_N = 32  # tokens per step of the loop over the context


@triton.jit
def paged_decode_kernel(q_ptr, k_ptr, v_ptr, table_ptr, ctx_ptr, rows_ptr, out_ptr, scale, block_size, group, d,
                        stride_qt, stride_qh, stride_ks, stride_kh, stride_tb, stride_ot, stride_oh,
                        GROUP: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr):
    """One program per (sequence, kv head): its query heads attend over the context through the block table."""
    ### BEGIN SOLUTION
    b, kvh = tl.program_id(0), tl.program_id(1)
    row = tl.load(rows_ptr + b)  # the sequence's row in q and out
    ctx = tl.load(ctx_ptr + b)
    g, c = tl.arange(0, GROUP), tl.arange(0, D)
    heads = kvh * group + g  # [GROUP] the query heads of this kv head
    head_mask, d_mask = g < group, c < d
    q = tl.load(q_ptr + row * stride_qt + heads[:, None] * stride_qh + c[None, :],
                mask=head_mask[:, None] & d_mask[None, :], other=0.0).to(tl.float32) * scale  # [GROUP, D]
    m = tl.full((GROUP,), -float("inf"), tl.float32)
    denom = tl.zeros((GROUP,), tl.float32)
    acc = tl.zeros((GROUP, D), tl.float32)
    for n0 in range(0, ctx, BLOCK_N):
        t = n0 + tl.arange(0, BLOCK_N)  # [BLOCK_N] token positions, maybe across several blocks
        valid = t < ctx
        block = tl.load(table_ptr + b * stride_tb + t // block_size, mask=valid, other=0).to(tl.int64)
        slots = block * block_size + t % block_size  # [BLOCK_N] where each token lies in the pool
        kv_mask = valid[:, None] & d_mask[None, :]
        k = tl.load(k_ptr + slots[:, None] * stride_ks + kvh * stride_kh + c[None, :], mask=kv_mask, other=0.0)
        s = tl.sum(q[:, None, :] * k.to(tl.float32)[None, :, :], axis=2)  # [GROUP, BLOCK_N]
        s = tl.where(valid[None, :], s, -float("inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])  # [GROUP, BLOCK_N]
        v = tl.load(v_ptr + slots[:, None] * stride_ks + kvh * stride_kh + c[None, :], mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v.to(tl.float32)[None, :, :], axis=1)  # [GROUP, D]
        denom = denom * alpha + tl.sum(p, axis=1)
        m = m_new
    out = acc / denom[:, None]
    tl.store(out_ptr + row * stride_ot + heads[:, None] * stride_oh + c[None, :], out.to(out_ptr.dtype.element_ty),
             mask=head_mask[:, None] & d_mask[None, :])
    ### END SOLUTION


def paged_decode_attention(q: Tensor, k_slots: Tensor, v_slots: Tensor, block_tables: Tensor, context_lens: Tensor,
                           block_size: int, max_context: int | None = None, rows: Tensor | None = None,
                           out: Tensor | None = None) -> Tensor:
    """Decode attention through block tables on paged_decode_kernel (the engine's interface).

    q: [tokens, heads, d]; k_slots, v_slots: [slots, kv_heads, d], the same strides, d contiguous;
    block_tables: int [B, max_blocks]; context_lens: int [B], each >= 1; block_size: slots per block;
    max_context: the longest context (the engine passes it; one program walks a whole context, so
    it is not needed here); rows: int [B], the row of q (and out) of each sequence (None: 0..B-1);
    out: [tokens, heads, d] whose rows `rows` are written, and no others (None: a new tensor). -> out.
    out[rows[b], h] = softmax(q[rows[b], h] . K_b^T / sqrt(d)) V_b over sequence b's context, (definition)
    K_b, V_b being kv head h // (heads // kv_heads) of its tokens' slots, in q's dtype. (definition)
    One program per (sequence, kv head), reading each key and value of its context once; no slot outside
    a sequence's context is read. Shape errors raise ValueError (given).
    """
    batch, (_, heads, d), kv_heads = block_tables.shape[0], q.shape, k_slots.shape[1]
    if heads % kv_heads or k_slots.shape[2] != d or v_slots.shape != k_slots.shape or context_lens.shape != (batch,):
        raise ValueError(f"paged_decode_attention: q [tokens, heads, d], pools [slots, kv_heads, d] with kv_heads "
                         f"dividing heads, context_lens [B]; got q {tuple(q.shape)}, pools {tuple(k_slots.shape)} "
                         f"and {tuple(v_slots.shape)}, block_tables {tuple(block_tables.shape)}, "
                         f"context_lens {tuple(context_lens.shape)}")
    if k_slots.stride() != v_slots.stride() or k_slots.stride(2) != 1:
        raise ValueError(f"paged_decode_attention: K and V pools need the same strides, d contiguous; got "
                         f"{k_slots.stride()} and {v_slots.stride()}")
    check_device(q, k_slots, v_slots, block_tables, context_lens, rows, out)
    q = q if q.stride(2) == 1 else q.contiguous()
    rows = torch.arange(batch, dtype=torch.int32, device=q.device) if rows is None else rows
    out = torch.empty_like(q) if out is None else out
    if batch == 0:
        return out
    ### BEGIN SOLUTION
    group = heads // kv_heads
    paged_decode_kernel[(batch, kv_heads)](
        q, k_slots, v_slots, block_tables, context_lens, rows, out, d ** -0.5, block_size, group, d,
        q.stride(0), q.stride(1), k_slots.stride(0), k_slots.stride(1), block_tables.stride(0),
        out.stride(0), out.stride(1), GROUP=next_pow2(group), D=next_pow2(d), BLOCK_N=BLOCK_N)
    ### END SOLUTION
    return out


# %% [markdown]
# <details><summary>Hint 1: a nudge</summary>
#
# Write it in three parts: which query heads and which row this program serves; the loop over the
# context's tiles, where each token's slot comes from the block table; the online softmax of 7.3,
# now with an output accumulator beside the running max and sum, one of each per query head.
# </details>
#
# <details><summary>Hint 2: the idea</summary>
#
# The query block is `[GROUP, D]` (lanes past the group or past `d` masked). For a tile of tokens:
# their block numbers from the table (widen them to 64 bits before multiplying by a stride: a large
# pool passes 2³¹), their slots, a masked load of K and of V; scores as a broadcast product summed
# over `d`, minus infinity past the context; rescale the accumulator and the sum by the change of
# the max, add this tile's share. Divide at the end; store only the real heads.
# </details>
#
# <details><summary>Hint 3: the last step</summary>
#
# The launcher: a 2-D grid, one program per sequence and kv head; the query heads per kv head; the
# softmax scale (one over the square root of `d`); the strides in the kernel's order; the `constexpr`
# sizes are powers of two covering the group and `d`.
# </details>


# %% [markdown]
# Three sequences of 7, 13 and 4 tokens over a pool of 8 blocks of 4 slots, their blocks handed
# out shuffled. Each cell below is a slot of the K pool (a row per block); its colour is the
# program (here: the sequence) that read it. Block 2 holds no one's tokens and is never read,
# nor are the free slots at the end of a sequence's last block (blocks 0 and 4).

# %%
bs_demo, lens_demo = 4, [7, 13, 4]
tables_demo = torch.tensor([[5, 0, -1, -1], [3, 7, 1, 4], [6, -1, -1, -1]], dtype=torch.int32)
k_pool, v_pool = torch.randn(8 * bs_demo, 1, 16), torch.randn(8 * bs_demo, 1, 16)  # [slots, kv_heads, d]
q_pool = torch.randn(3, 2, 16)                                                    # [B, heads, d]: GQA ratio 2
ctx_demo = torch.tensor(lens_demo, dtype=torch.int32)
seen = record_accesses(lambda: paged_decode_attention(q_pool, k_pool, v_pool, tables_demo, ctx_demo, bs_demo),
                       k_pool=k_pool)
per_slot = seen[("k_pool", "load")][:, 0, 0].view(8, bs_demo)  # [blocks, slots per block]
fig = go.Figure(go.Heatmap(z=per_slot.tolist(), colorscale=[[0, "#1f77b4"], [0.5, "#ff7f0e"], [1, "#2ca02c"]],
                           zmin=0, zmax=2, xgap=2, ygap=2, colorbar=dict(title="sequence", tickvals=[0, 1, 2]),
                           hovertemplate="block %{y}, offset %{x}: sequence %{z}<extra></extra>"))
fig.update_layout(title="paged decode: the K slots each sequence's program reads", xaxis_title="offset in the block",
                  yaxis_title="block of the pool", height=360)
fig.update_yaxes(autorange="reversed", dtick=1)
fig.update_xaxes(dtick=1)
fig.show()
print("equals the spec:", torch.allclose(paged_decode_attention(q_pool, k_pool, v_pool, tables_demo, ctx_demo, bs_demo),
                                         paged_decode_spec(q_pool, k_pool, v_pool, tables_demo, ctx_demo, bs_demo),
                                         atol=1e-5))

# %%
check("7.6")

# %% [markdown]
# ## Your kernel inside the engine (~5 min)
#
# `LLM(..., attention_backend="triton")` runs the paged cache's attention on Triton kernels
# (`minillm/cache/paged_triton.py`): a kernel writes each step's K/V into the pool, a prefill
# kernel serves the prompts, and `paged_decode_attention` serves every sequence that decodes one
# token. `Components(paged_decode=...)` replaces that last one with yours. Below, `tiny` (8 query
# heads over 4 kv heads: GQA ratio 2) generates greedily with your kernel in blocks of 8 tokens,
# three prompts of different lengths at once, against the engine's default torch attention. The
# interpreter is slow, so only a few tokens: each one after the first (which the prefill kernel
# computes) went through your kernel, in all six layers.

# %%
YOURS = Components(paged_decode=paged_decode_attention, source="this notebook")
prompts = ["def fibonacci(n):", "import os\nimport sys\n\nclass Stack:\n    def push(self, x):", "x ="]
greedy = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
engine = dict(block_size=8, num_kv_blocks=48)
want = [o.token_ids for o in LLM("tiny", **engine).generate(prompts, greedy, use_tqdm=False)]
got = [o.token_ids for o in LLM("tiny", attention_backend="triton", components=YOURS, **engine)
       .generate(prompts, greedy, use_tqdm=False)]
for prompt, g, w in zip(prompts, got, want):
    print(f"{prompt.splitlines()[0]!r:>22}: {'same' if g == w else 'DIFFERENT'} tokens {g}")

# %% [markdown]
# `check("7.E")` (part of `make grade LAB=07`) does the same with the kernel of your notebook,
# through `minillm.labkit.plug`, and checks that the engine called it.

# %%
check("7.E")

# %% [markdown]
# ## What a GPU would measure: bandwidth against the roofline (~5 min)
#
# Nothing so far timed a Triton kernel, on purpose: the interpreter runs each program one after
# another in numpy, so its times measure numpy. On a GPU, the number to report for a memory-bound
# kernel is its **achieved bandwidth**, the bytes it must move divided by its time, as a fraction
# of the GPU's peak (gpt-fast prints it after every run). A good fused kernel comes close to the
# peak a plain copy reaches on the same GPU (measure both, as the next section does on this CPU);
# a kernel far below has a problem (uncoalesced loads, too few programs to fill the GPU, a tile too
# small to hide latency).
#
# The bytes are a property of the kernel's design, and you can count them here. Below, each
# kernel at a size a real model uses (a Llama-3-8B-like layer in bfloat16), its minimal traffic,
# its arithmetic intensity, and the time the roofline of an H100 allows. Every kernel but the
# prefill-sized matmul is memory-bound: their speed is bytes over bandwidth, and fusing (RMSNorm),
# packing (int4) and reading K/V once per kv head (GQA) are exactly ways to cut the bytes.

# %%
hidden, inter, ctx, batch, kv, dh = 4096, 14336, 4096, 32, 8, 128
cases = {
    "vector add, 16M elements": OpCost(16e6, 3 * 16e6 * 2, 0),
    "residual + RMSNorm, 32 x 4096": OpCost(5 * 32 * hidden, (2 + 2) * 32 * hidden * 2 + hidden * 2, 0),
    "  the same unfused (3 passes)": OpCost(5 * 32 * hidden, (3 + 3) * 32 * hidden * 2 + hidden * 2, 0),
    "softmax (online: read twice), 32 x 128k": OpCost(5 * 32 * 128e3, 3 * 32 * 128e3 * 2, 0),
    "matmul 4096 x 4096 x 4096 (prefill)": OpCost(2 * 4096**3, 3 * 4096**2 * 2, 0),
    "bf16 linear at batch 1 (4096 -> 14336)": OpCost(2 * hidden * inter, hidden * inter * 2, 0),
    "int4-g64 linear at batch 1 (fused)": OpCost(2 * hidden * inter, hidden * inter * (0.5 + 5 / 64), 0),
    "paged decode, 32 seqs x 4k context": OpCost(4 * batch * 32 * ctx * dh, 2 * batch * ctx * kv * dh * 2, 0),
    "  the same with K/V read per query head": OpCost(4 * batch * 32 * ctx * dh, 2 * batch * ctx * 32 * dh * 2, 0),
}
h100 = PROFILES["H100 SXM"]
print(f"{'kernel (bfloat16)':>42} {'MB moved':>9} {'FLOP/byte':>9} {'H100 roofline µs':>17}")
for name, cost in cases.items():
    print(f"{name:>42} {cost.bytes / 1e6:9.1f} {cost.intensity:9.1f} "
          f"{predicted_time(h100, cost, 'bfloat16') * 1e6:17.1f}")
fig = go.Figure(go.Bar(y=list(cases), x=[predicted_time(h100, c, "bfloat16") * 1e6 for c in cases.values()],
                       orientation="h"))
fig.update_layout(title="The fastest each kernel can run on an H100 (the roofline)", xaxis_title="µs (log scale)",
                  xaxis_type="log", height=420, margin=dict(l=280))
fig.update_yaxes(autorange="reversed")
fig.show()

# %% [markdown]
# On a machine with a CUDA GPU, `python -m minillm.bench kernels` times the engine's versions of
# these kernels, measures the GPU's own peak bandwidth and FLOP/s first, and prints each kernel's
# achieved fraction of them, side by side with the PyTorch reference (on this CPU it says it needs
# a GPU and runs a correctness smoke pass instead). Your kernels from this lab would run there
# unchanged: the same code compiles for the GPU when `TRITON_INTERPRET` is not set.
#
# %% [markdown]
# ## Predict, then measure: the engine's fused kernels at SmolLM2's shapes, on this machine (~15 min)
#
# The table above is arithmetic. Now measure. On this CPU the engine does not run Triton at all
# for speed: it runs the same two ideas as 7.5 and 7.6 in C++, **fused**, and those it can time.
#
# * **Fused decode attention**, `minillm/kernels/paged_decode_cpu.py` (the C++ one,
#   `paged_decode_cpu.cpp`): 7.6's interface and job, reading K/V in place through the block tables,
#   once per kv head.
# * **Fused quantized product**, `minillm/quant/fused.py` (`fused_matvec.cpp`): 7.5's job for int8
#   and int4, the codes converted to floats in registers, the float weight never written.
#
# Both at the shapes of **SmolLM2-135M** (`minillm.perf.model_shape`: hidden 576, 9 query heads
# over 3 kv heads of 64, MLP 1,536, 30 layers), and at the size of one decode step: every layer's
# matrices (or every layer's K/V pool) in turn, so that, as in a real step, the bytes come from main
# memory and not from a cache that still holds the previous call's. Each kernel's **bound** is the
# bytes it must move (read its weights or its K/V once, write its output) over this machine's
# memory bandwidth, measured the way lab 00 measured it (a large copy).

# %%
from minillm.labkit import compare, quick_run
from minillm.perf import model_shape
from minillm.perf.machine import machine, measure_bandwidth
from minillm.perf.timing import median_time
from minillm.quant import fused
from minillm.kernels import paged_decode_cpu

smol = model_shape("SmolLM2-135M")
H, inter, heads, kv_heads, d = (smol.hidden_size, smol.intermediate_size, smol.num_attention_heads,
                            smol.num_key_value_heads, smol.head_dim)
layers = 8 if quick_run() else smol.num_hidden_layers  # the test suite runs a few layers, a learner all 30
cpu_bandwidth = measure_bandwidth(torch.device("cpu"))  # bytes/s, this notebook's torch threads
print(f"{machine()}\nmeasured copy bandwidth: {cpu_bandwidth / 1e9:.1f} GB/s; SmolLM2's layer: hidden {H}, "
      f"{heads} heads over {kv_heads} kv heads of {d}, MLP {inter}; timing {layers} layers")

# %% [markdown]
# **Before you run the next cells**, predict one figure: the time of SmolLM2's int8 layer products
# for one decode token at batch 1 (the four matrices of each layer: q, k and v stacked
# `[H + 2·kv_heads·d, H]`, the output projection `[H, H]`, gate and up stacked `[2·inter, H]`, down
# `[H, inter]`; a byte a weight and a float32 scale a row), from their bytes and the bandwidth just
# printed. Lab 00 did the same for a whole step.

# %%
MY_PREDICTION = None  # ms: the int8 products of the timed layers at batch 1, from their bytes and the bandwidth above

# %%
gen = torch.Generator().manual_seed(7)
shapes = [(H + 2 * kv_heads * d, H), (H, H), (2 * inter, H), (H, inter)]  # [out, in] of each projection of a layer
float_w = [torch.randn(o, i, generator=gen) * 0.02 for _ in range(layers) for o, i in shapes]
int8_w = [codecs.quantize_int8(w) for w in float_w]                                  # (q, scale) each
int4_w = [(codecs.pack_int4(c), s, z) for c, s, z in (codecs.quantize_int4(w, 32) for w in float_w)]
x_in = {i: torch.randn(1, i, generator=gen) for _, i in shapes}                      # one token's activations


def stored_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def io_bytes(ws) -> int:  # each product reads its x and writes its y, float32
    return sum(4 * (w.shape[1] + w.shape[0]) for w in ws)


# one decode step's products: the callable and the bytes it must move at least
products = {
    "float32 product (torch)": (lambda: [torch.nn.functional.linear(x_in[w.shape[1]], w) for w in float_w],
                                stored_bytes(float_w) + io_bytes(float_w)),
    "int8, fused (C++)": (lambda: [fused.int8_linear(x_in[w.shape[1]], q, s, None)
                                   for w, (q, s) in zip(float_w, int8_w)],
                          sum(stored_bytes(t) for t in int8_w) + io_bytes(float_w)),
    "int4-g32, fused (C++)": (lambda: [fused.int4_linear(x_in[w.shape[1]], p, s, z, None)
                                      for w, (p, s, z) in zip(float_w, int4_w)],
                              sum(stored_bytes(t) for t in int4_w) + io_bytes(float_w)),
}

# decode attention: 8 sequences of 512 tokens, one pool per layer, blocks of 16 handed out shuffled
batch, context, block = 8, 512, 16
blocks_per_seq = context // block
tables = torch.randperm(batch * blocks_per_seq, generator=gen).reshape(batch, blocks_per_seq).int()
lens = torch.full((batch,), context, dtype=torch.int32)
pools = [(torch.randn(batch * context, kv_heads, d, generator=gen), torch.randn(batch * context, kv_heads, d,
                                                                               generator=gen)) for _ in range(layers)]
q_dec = torch.randn(batch, heads, d, generator=gen)
attention_bytes = layers * (2 * batch * context * kv_heads * d * 4 + 2 * q_dec.numel() * 4)  # K, V once; q in, out
kernels = dict(products)
if paged_decode_cpu.available():
    kernels["decode attention, fused (C++)"] = (
        lambda: [paged_decode_cpu.paged_decode_attention_cpu(q_dec, k, v, tables, lens, block) for k, v in pools],
        attention_bytes)
if not fused.available():
    print("no C++ compiler here: the fused kernels do not exist, and only the float32 product is timed")
    kernels = {n: k for n, k in kernels.items() if "fused" not in n}

measured_s = {name: median_time(fn, repeats=3 if quick_run() else 7) for name, (fn, _) in kernels.items()}
print(f"{'kernel, ' + str(layers) + ' layers':>34} {'MB moved':>9} {'bound ms':>9} {'measured ms':>12} {'GB/s':>6} "
      f"{'of bound':>9}")
for name, (_, moved) in kernels.items():
    bound = moved / cpu_bandwidth
    print(f"{name:>34} {moved / 1e6:9.1f} {bound * 1e3:9.2f} {measured_s[name] * 1e3:12.2f} "
          f"{moved / measured_s[name] / 1e9:6.1f} {bound / measured_s[name]:9.0%}")

# %%
if "int8, fused (C++)" in kernels:
    compare(f"SmolLM2's int8 layer products for one token ({layers} layers), fused, on this CPU", MY_PREDICTION,
            theory=kernels["int8, fused (C++)"][1] / cpu_bandwidth * 1e3,
            measured=measured_s["int8, fused (C++)"] * 1e3,
            unit="ms", theory_name="bandwidth bound",
            gap="the kernel's time over the time its bytes take at the copy bandwidth: near 1, it is memory-bound; "
                "far above, something else (the code-to-float arithmetic, threads, a cache the copy did not use) "
                "sets its pace.")
fig = go.Figure([go.Bar(name="bandwidth bound", y=list(kernels), orientation="h", marker_color="#bbbbbb",
                        x=[m / cpu_bandwidth * 1e3 for _, m in kernels.values()]),
                 go.Bar(name="measured", y=list(kernels), x=[measured_s[n] * 1e3 for n in kernels], orientation="h",
                        marker_color="#3d6fb6")])
fig.update_layout(title=f"The engine's CPU kernels at SmolLM2's shapes ({layers} layers), against their bytes",
                  xaxis_title="ms", barmode="group", height=340, margin=dict(l=230))
fig.update_yaxes(autorange="reversed")
fig.show()

# %% [markdown]
# Read the "of bound" column. The float32 product is ATen's matrix-vector routine, the reference
# point for what "memory-bound" reaches on this machine; the fused int8 and int4 kernels read a
# quarter and about an eighth of its bytes, and the question is whether their time fell as far. Where
# it did not, the extra work per byte (unpacking, subtracting the zero point, scaling) is what
# remains: at one row of `x` that arithmetic costs about as much as the multiply-add itself. Decode
# attention reads each key and value once per kv head, for 3 query heads each (GQA), so it has
# little arithmetic per byte.
#
# ### Your kernels on a GPU
#
# With a GPU (`torch.cuda.is_available()`), the next cell times **your** 7.5 and 7.6 kernels, compiled
# for it, at the same shapes, against the GPU's own measured bandwidth. Without one it says so,
# and shows what the same bytes would take at the bandwidth of lab 00's hardware profiles
# (`minillm/perf/hardware.py`, each from its vendor's datasheet): the speed a good kernel could
# approach there.

# %%
gpu_bytes = {"int4-g32 products (your 7.5)": kernels["int4-g32, fused (C++)"][1] if "int4-g32, fused (C++)" in kernels
             else sum(stored_bytes(t) for t in int4_w) + io_bytes(float_w),
             "decode attention (your 7.6)": attention_bytes}
if torch.cuda.is_available() and not INTERPRETED:
    cuda = torch.device("cuda")
    gpu_bandwidth = measure_bandwidth(cuda)
    w4 = [(w.shape[1], p.to(cuda), s.to(cuda), z.to(cuda)) for w, (p, s, z) in zip(float_w, int4_w)]
    xs = {i: x.to(cuda) for i, x in x_in.items()}
    pools_gpu = [(k.to(cuda), v.to(cuda)) for k, v in pools]
    args = (tables.to(cuda), lens.to(cuda), block)
    q_gpu = q_dec.to(cuda)
    yours = {"int4-g32 products (your 7.5)": lambda: [int4_linear(xs[i], p, s, z, None) for i, p, s, z in w4],
             "decode attention (your 7.6)": lambda: [paged_decode_attention(q_gpu, k, v, *args) for k, v in pools_gpu]}
    print(f"{torch.cuda.get_device_name()}: measured copy bandwidth {gpu_bandwidth / 1e9:.0f} GB/s")
    for name, fn in yours.items():
        seconds = median_time(fn, repeats=10, sync=torch.cuda.synchronize)
        print(f"{name:>30}: {seconds * 1e6:8.1f} µs, bound {gpu_bytes[name] / gpu_bandwidth * 1e6:8.1f} µs, "
              f"{gpu_bytes[name] / seconds / 1e9:6.0f} GB/s ({gpu_bytes[name] / gpu_bandwidth / seconds:.0%} of bound)")
else:
    print("No GPU here: your Triton kernels run in Triton's interpreter, one program after another in numpy, so "
          "timing them would time numpy. What the same bytes would take on the GPUs of lab 00's hardware profiles, "
          "at their datasheet bandwidth (the fastest they could run there):")
    gpus = {name: p for name, p in PROFILES.items() if "LPU" not in name}
    print(f"{'':>30} " + " ".join(f"{name:>14}" for name in gpus))
    for name, moved in gpu_bytes.items():
        print(f"{name:>30} " + " ".join(f"{moved / p.bandwidth * 1e6:11.1f} µs" for p in gpus.values()))
    print(f"{'bandwidth':>30} " + " ".join(f"{p.bandwidth / 1e9:9.0f} GB/s" for p in gpus.values())
          + f"   (this CPU: {cpu_bandwidth / 1e9:.1f} GB/s)")

# %% [markdown]
# ## How production engines do it (~5 min)
#
# * **FlashAttention** (Dao et al. 2022, 2023) is 7.3's online softmax applied to attention in
#   prefill: tiles of queries against tiles of keys, the scores never written to memory.
#   **FlashDecoding** splits a long context over several programs when there are too few sequences
#   to fill the GPU, and combines the partial results by their log-sum-exp: the engine's
#   `paged_decode_attention` does that (its `splits`), and `prefill_attention` is the varlen,
#   paged FlashAttention.
# * **vLLM's PagedAttention** kernel is 7.6, in CUDA, with the K cache laid out so that a warp's
#   loads are contiguous; vLLM and SGLang now also use FlashInfer's and FlashAttention's paged
#   kernels, which pick tile sizes per GPU and per GQA ratio.
# * **Fused norms and activations**: engines fuse the residual add into RMSNorm (7.2) and SiLU into
#   the gate-and-up matmul's epilogue; **torch.compile** generates many such Triton kernels itself.
# * **Quantized matmuls**: Marlin and Machete (vLLM), ExLlama, and llama.cpp's kernels are 7.5
#   with care for the GPU: the codes pre-shuffled so that a tile is one wide load, dequantization
#   overlapped with the tensor cores, and for larger batches the weight tile reused across rows.
# * **Autotuning**: `@triton.autotune` tries several block sizes and numbers of warps per shape and
#   keeps the fastest; the best tile for a decode (M = 1) is not the best for a prefill.
