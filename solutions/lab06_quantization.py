# %% [markdown]
# # Lab 06 · Quantization
#
# **Time:** about 145 minutes in all (each section's heading gives its share; the experiments
# on SmolLM2 run a few minutes on a 2-core CPU). **You need:** lab 00 (the roofline: why a decode
# step waits on memory) and lab 01 (the linear layers of a decoder block).
#
# **See also:** the visualizer's **Quantization** page (`make app`; it quantizes a model live and
# scores it), and the Quantization section of [docs/engine.md](../docs/engine.md#quantization)
# (the schemes, their bytes per weight, how to turn them on).
#
# A decode step reads every weight of the model once to produce one token per sequence (lab 00).
# Store each weight in fewer bits and the step moves fewer bytes: 4-bit weights are a quarter of
# bf16's, so a memory-bound step can run up to four times faster, and a model four times larger
# fits on the same GPU. The price is error: every weight is rounded to one of 256 levels (8 bits)
# or of 16 (4 bits).
#
# This lab is about paying as little of that price as possible. You will write the codecs that
# turn a float matrix into a few bits per weight (int8 with a scale per row, int4 with a scale and
# a zero point per group of inputs), pack two 4-bit codes into each byte, and compute a linear
# layer straight from the packed form. Your codecs then run inside `minillm`. Finally you measure
# what rounding costs: on the model's held-out text, layer by layer and projection by projection,
# and whether the errors of two layers always add up, or sometimes cancel.
#
# Everything here is **weight-only** quantization: activations and the KV cache stay in full
# precision, and only the matrices of the linear layers shrink.
#
# ## Learning objectives
# By the end you can
# 1. quantize a matrix symmetrically (int8, one scale per output channel) and asymmetrically
#    (int4, a scale and a zero point per group), and bound the error of each weight;
# 2. count the bits a weight really costs once its scales and zero points are included;
# 3. pack 4-bit codes two per byte and unpack them, odd lengths included;
# 4. write the forward of a quantized linear layer, and run your codecs inside the real engine;
# 5. measure quality (perplexity, KL from the full model, top-1 agreement) against bits per weight;
# 6. find which layers and projections are sensitive, and test whether errors cancel, with the
#    noise of the measurement taken into account;
# 7. explain with the roofline why weight-only quantization speeds up decode but not prefill, and
#    why on a CPU without a fused kernel it can even slow decode down;
# 8. predict a scheme's decode speedup on SmolLM2 from its bytes per token, then measure each scheme
#    against its own bandwidth bound, with its quality beside it.
#
# ## How this lab works
# Write code only in the exercise cells (they contain `raise NotImplementedError`), keeping names
# and signatures. Run each `check(...)` cell for feedback. `make grade LAB=06` grades the notebook,
# and like `check("6.E")` below it runs your codecs and your quantized linear layer **inside the
# real engine** and compares its logits and tokens with those of the engine's own.
# `minillm/quant/` holds the engine's version (`codecs.py`, `linear.py`, `apply.py`, `eval.py`,
# `sensitivity.py`; int4's packing sits in `minillm/kernels/int4_format.py`, beside the kernel of
# lab 07 that reads it): read it after you finish.

# %% tags=["setup"]
import copy
import math
from collections.abc import Sequence
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from minillm.labkit import check
from minillm.quant import QuantConfig, quantize_model
from minillm.quant.codecs import INT4_MAX, INT8_MAX, TINY
from minillm.experiments.quant_quality import Quality, Reference

# %%
import plotly.graph_objects as go
from plotly.subplots import make_subplots
from tokenizers import Tokenizer

from minillm import LLM, SamplingParams
from minillm.config import Components
from minillm.models.registry import BUNDLED_DIR
from minillm.perf import PROFILES, OpCost, decode_cost, median_time, model_shape, param_count, prefill_cost
from minillm.quant import linear_weight_bytes
from minillm.quant.codecs import dequantize_int4, dequantize_int8
from minillm.quant.quantized_linear import scaled_linear
from minillm.experiments.quant_sensitivity import measure, sensitivity_grid
from minillm.corpus import corpus_split, encode_corpus, spread_rows

torch.set_num_threads(1)  # small model, small steps: one thread avoids thread-pool overhead
tiny = LLM("tiny").engine.model  # the full-precision model every experiment compares with

# %% [markdown]
# ## The concept: a scale, a zero point, and who shares them (~5 min)
#
# Uniform quantization keeps a float **scale** `s` and an integer **zero point** `z` beside small
# integer **codes** `q`, and recovers each weight as
#
# $$\hat w = (q - z)\, s .$$
#
# The codes are evenly spaced, `s` apart; `z` is the code that stands for 0. Rounding `w / s` to the
# nearest code is off by at most half a step, so every weight comes back within
#
# $$|w - \hat w| \le s / 2 .$$
#
# Two choices decide how large `s` must be:
#
# * **Symmetric or asymmetric.** Symmetric codes run from −N to N around `z = 0`, and the step is
#   chosen so that the largest |w| lands on the last code, ±N: no code is wasted beyond the
#   weights. Asymmetric codes run from 0 to 15 (4 bits), and the 16 levels are spread from the
#   smallest weight to the largest, so none is wasted on a side where there are no weights.
#
#   A worked example with a small symmetric code, −7..7 (not the one you will write): the row
#   `[0.7, −0.35, 0.1, 0.05]` has largest |w| 0.7, so the step is 0.1 and 0.7 lands on 7. Then
#   −0.35 is 3.5 steps below zero: a tie between −3 and −4; 0.1 is exactly 1 step; 0.05 is half a
#   step, a tie between 0 and 1. Ties need a rule, and the engine's is "to the even neighbour"
#   (`torch.round`'s): the codes are `[7, −4, 1, 0]`, and the row comes back as
#   `[0.7, −0.4, 0.1, 0.0]`, each weight within half a step (0.05) of where it was.
# * **Granularity: who shares one scale.** One scale for the whole matrix lets a single outlier
#   inflate the step of every weight. One per **output channel** (a row of `nn.Linear`'s
#   `weight: [out, in]`) costs nothing at run time: output `o` is `Σ_i x_i ŵ_oi = s_o Σ_i x_i q_oi`,
#   one multiply per output. One per **group** of, say, 64 consecutive inputs of a row is finer
#   still: 4-bit codes need it, since 16 levels over a whole row of outliers are too coarse.
#
# Scales and zero points are stored too. `minillm` keeps a float32 scale and an 8-bit zero point per
# group, so int4 with groups of 64 costs `4 + (32 + 8) / 64 = 4.625` bits per weight, not 4.

# %% [markdown]
# ## Exercise 6.1 · int8: symmetric, one scale per output channel (~10 min)
#
# The codes are int8, −127..127 (−128 is left out, so that `q` and `−q` are both codes), one scale
# per row of `w: [out, in]`, and the row's largest |w| lands on ±127: the example above with 127
# in place of 7. Two details decide whether your codes equal the engine's **bit for bit**:
#
# * **Ties.** A weight exactly halfway between two codes goes to the even one, as in the example.
# * **Which number is rounded.** A code is decided by the weight's *quotient* by its scale,
#   computed in float32. Algebraically equivalent expressions are not equivalent in floating
#   point: at a tie, a product that is a hair off the half rounds to the other neighbour. The
#   grader tries weights that sit exactly on halves.
#
# A row of zeros would give a scale of 0 and a division by zero: no scale may be smaller than
# `TINY` (the smallest normal float32, imported above), so such a row quantizes to zeros.

# %% exercise="6.1"
def quantize_int8(w: Tensor) -> tuple[Tensor, Tensor]:
    """Symmetric quantization, one scale per output channel (row): the engine's codes, bit for bit.

    w: [out, in] float32, left unchanged -> (q: int8 [out, in], scale: float32 [out]).
    Rules: codes run from -127 to 127 and code 0 stands for 0; each row's largest |w| lands on +-127;
    every other weight gets the code nearest to its quotient by its row's scale (divided in float32),
    a tie going to the even code; no scale is below TINY, so a row of zeros gives codes 0, never NaN.
    Each weight comes back (code times scale) within half a step of where it was.
    """
    ### BEGIN SOLUTION
    scale = (w.abs().amax(dim=1).float() / INT8_MAX).clamp_min(TINY)        # [out]
    q = torch.round(w.float() / scale[:, None]).clamp(-INT8_MAX, INT8_MAX)  # [out, in]
    return q.to(torch.int8), scale
    ### END SOLUTION


# %% [markdown]
# <details><summary>Hint 1: a nudge</summary>
#
# Work one row by hand first, with the example above: what single number of the row fixes the
# step? Then do every row at once: a reduction along the inputs gives one value per row.
# </details>
#
# <details><summary>Hint 2: the idea</summary>
#
# The step of a row is its largest magnitude spread over 127 codes, never below `TINY`. Broadcast
# the `[out]` scales against `[out, in]` (one extra dimension), divide, round with PyTorch's
# rounding function (it already sends ties to even), keep the codes in range, convert to int8.
# </details>
#
# <details><summary>Hint 3: the formula, as a last resort</summary>
#
# `scale = max(max_i |w_oi| / 127, TINY)`, `q_oi = clamp(round(w_oi / scale_o), −127, 127)`.
# </details>

# %% [markdown]
# How much does the granularity matter? Take the first attention projection of `tiny` (q, k and v
# stacked in one matrix) and quantize it to int8 with one scale per row, then with one scale for
# the whole matrix:

# %%
w_qkv = tiny.model.layers[0].self_attn.qkv_proj.weight.detach()  # [q + k + v rows, hidden]
q8, s8 = quantize_int8(w_qkv)
per_tensor = w_qkv.abs().max() / INT8_MAX
err_row = (w_qkv - q8.float() * s8[:, None]).abs().mean()
err_tensor = (w_qkv - torch.round(w_qkv / per_tensor) * per_tensor).abs().mean()
print(f"largest |w| of a row: from {w_qkv.abs().amax(1).min():.3f} to {w_qkv.abs().amax(1).max():.3f}")
print(f"mean |error|, a scale per row:    {err_row:.2e}")
print(f"mean |error|, one scale for all:  {err_tensor:.2e}  ({err_tensor / err_row:.1f}x larger)")

# %%
check("6.1")

# %% [markdown]
# ## Exercise 6.2 · int4: asymmetric, a scale and a zero point per group (~15 min)
#
# Split each row into groups of `group_size` consecutive inputs. Each group gets its own 16 codes,
# 0..15, evenly spaced over the group's range **stretched to hold 0**: from the smallest weight or
# 0, whichever is lower, to the largest weight or 0, whichever is higher. Code 0 sits at the bottom
# of that range, code 15 at its top, and the **zero point** is the whole code nearest to where 0
# falls.
#
# A worked example with 2-bit codes, 0..3 (not the one you will write): the group
# `[−0.3, 0.1, 0.6]` spans −0.3..0.6 (it holds 0 already), three steps of 0.3. Zero is one step
# above the bottom: the zero point is code 1. The weight 0.1 is a third of a step above zero,
# nearest to code 1 again; 0.6 is two steps above zero, code 3; −0.3 one step below, code 0. The
# codes `[0, 1, 3]` come back as `[−0.3, 0.0, 0.6]`. A group `[0.2, 0.5, 0.8]` would be stretched
# to 0..0.8 (step 0.8/3), with the zero point on code 0.
#
# Why hold 0? The zero point is then one of the 16 codes, so a weight of exactly 0 (and padding, or
# pruned weights) comes back exactly 0; and a group whose weights are all positive gets `z = 0`,
# all negative `z = 15`, instead of a zero point that does not fit in 4 bits. A group whose weights
# are all equal (`max == min`) is covered too: its range runs from 0 to that value. Only a group of
# zeros has `hi == lo`; keep every scale at least `TINY`, as in 6.1.
#
# Round to the nearest, halves to even, everywhere (the zero point too), and, as in 6.1, place a
# weight by its quotient by the scale, in float32. Return the codes, one scale and one zero point
# per group. A group size must be a positive integer that divides the row: anything else (one
# that leaves a partial group, 0, or a negative one, even if it divides) is an error, raised as a
# `ValueError` that says so.

# %% exercise="6.2"
def quantize_int4(w: Tensor, group_size: int) -> tuple[Tensor, Tensor, Tensor]:
    """Asymmetric quantization per group of consecutive inputs of each row: the engine's codes, bit for bit.

    w: [out, in] float32, left unchanged; group_size: inputs per group.
    -> (codes: uint8 [out, in] in 0..15, scale: float32 [out, groups], zero: uint8 [out, groups]), where groups
    is the number of groups in a row and group j of a row is its j-th run of group_size inputs.
    Rules: a group's 16 levels are evenly spaced over its range stretched to hold 0, code 0 at the bottom and
    15 at the top; its zero point is the whole code nearest to 0's place (so a weight of 0 comes back exactly);
    a weight's code is the zero point plus its quotient by the scale (in float32), rounded, within 0..15;
    every rounding is to the nearest, halves to even; no scale is below TINY (a group of zeros).
    Raises ValueError, saying why, unless group_size is a positive integer that divides the row (0 and
    negative sizes are refused even when they "divide").
    """
    ### BEGIN SOLUTION
    out_features, in_features = w.shape
    if group_size < 1:
        raise ValueError(f"group_size must be a positive integer, got {group_size}")
    if in_features % group_size:
        raise ValueError(f"group_size {group_size} does not divide the {in_features} inputs of a row: "
                         f"every group must be whole")
    groups = w.float().reshape(out_features, in_features // group_size, group_size)  # [out, groups, g]
    lo, hi = groups.amin(dim=2).clamp(max=0), groups.amax(dim=2).clamp(min=0)        # [out, groups]
    scale = ((hi - lo) / INT4_MAX).clamp_min(TINY)
    zero = torch.round(-lo / scale).clamp(0, INT4_MAX)
    codes = (torch.round(groups / scale[..., None]) + zero[..., None]).clamp(0, INT4_MAX)
    return codes.reshape(out_features, in_features).to(torch.uint8), scale, zero.to(torch.uint8)
    ### END SOLUTION


# %% [markdown]
# <details><summary>Hint 1: a nudge</summary>
#
# Give every group a row of its own: a view of `w` with one more dimension, `[out, groups, group_size]`.
# Then everything per group is a reduction over the last dimension, exactly like 6.1's per row.
# </details>
#
# <details><summary>Hint 2: the idea</summary>
#
# Stretching the range to hold 0 means: the low end is never above 0, the high end never below
# 0 (a clamp of each). 15 steps span the range; 0 sits "minus the low end, in steps" above code 0.
# Round that to get the zero point; a weight's code is its own position in steps, rounded, plus
# the zero point, kept in 0..15. Reshape the codes back to `[out, in]` before returning.
# </details>
#
# <details><summary>Hint 3: the formula, as a last resort</summary>
#
# `lo = min(min w, 0)`, `hi = max(max w, 0)`, `s = max((hi − lo) / 15, TINY)`, `z = round(−lo / s)`,
# `q = clamp(round(w / s) + z, 0, 15)`, per group.
# </details>


# %% [markdown]
# The first 96 weights of one row of that matrix, and what int4 with groups of 32 and int8 bring
# back. Each group of 32 has its own 16 levels: look how the steps change at 32 and 64.

# %%
row = w_qkv[5:6]                                               # [1, hidden]
codes4, scale4, zero4 = quantize_int4(row, 32)
back4 = dequantize_int4(codes4, scale4, zero4)[0, :96]
back8 = dequantize_int8(*quantize_int8(row))[0, :96]
inputs = list(range(96))
fig = go.Figure([go.Scatter(x=inputs, y=row[0, :96].tolist(), mode="markers", name="weight"),
                 go.Scatter(x=inputs, y=back8.tolist(), mode="lines", name="int8, a scale per row"),
                 go.Scatter(x=inputs, y=back4.tolist(), mode="lines", line_shape="hvh", name="int4, groups of 32")])
for edge in (31.5, 63.5):
    fig.add_vline(x=edge, line_dash="dot", line_color="gray")
fig.update_layout(title="One row, quantized: int4 has 16 levels per group of 32", xaxis_title="input index",
                  yaxis_title="weight", height=340)
fig.show()
print(f"int4 groups of 32, these three: scales {[round(s, 4) for s in scale4[0, :3].tolist()]}, "
      f"zero points {zero4[0, :3].tolist()}")

# %%
check("6.2")

# %% [markdown]
# ## Exercise 6.3 · Pack two 4-bit codes into a byte (~8 min)
#
# PyTorch has no 4-bit type: a `uint8` code in 0..15 wastes half its byte. Pack pairs of them:
# along the last dimension, the first code of each pair (an even index) goes to the **low** nibble
# (bits 0 to 3) of its byte, the second (an odd index) to the **high** nibble (bits 4 to 7).
#
# The same idea with 2-bit codes, four to a byte (not the one you will write): codes `[1, 2, 3, 0]`
# fill bits 0–1, 2–3, 4–5, 6–7, so the byte is `1 + 2·4 + 3·16 + 0·64 = 57`, `0b00111001`. Moving a
# code up by k bits multiplies it by 2^k; since the fields do not overlap, adding them and OR-ing
# them give the same byte.
#
# An odd number of codes is padded with one code 0 at the end, so `n` codes take `⌈n / 2⌉` bytes.
# This order is a convention (the one of `minillm`'s checkpoints); what matters is that packing and
# unpacking agree on it.

# %% exercise="6.3"
def pack_int4(codes: Tensor) -> Tensor:
    """Two 4-bit codes per byte along the last dimension (minillm's checkpoint layout).

    codes: uint8 [..., n], values in 0..15, any leading dimensions -> uint8 [..., half of n, rounded up].
    Byte i holds codes 2i (low nibble) and 2i + 1 (high nibble) of the last dimension; an odd n is
    padded with one code 0 at the end. codes is left unchanged.
    """
    ### BEGIN SOLUTION
    if codes.shape[-1] % 2:
        codes = F.pad(codes, (0, 1))
    codes = codes.to(torch.uint8)
    return codes[..., 0::2] | (codes[..., 1::2] << 4)  # [..., ceil(n / 2)]
    ### END SOLUTION


# %% [markdown]
# <details><summary>Hint 1: a nudge</summary>
#
# Make the length even first (one extra code 0 at the end of the last dimension when it is odd),
# then think of the codes as pairs: the even positions and the odd positions, two tensors of the
# same shape.
# </details>
#
# <details><summary>Hint 2: the idea</summary>
#
# Slicing with a step of 2 picks every other code. The low code stays where it is; the high code
# moves up by 4 bits; combine the two fields into one byte with a bitwise operator (uint8 tensors
# support them).
# </details>


# %%
print("codes [1, 2, 3, 4, 5] ->", pack_int4(torch.tensor([1, 2, 3, 4, 5], dtype=torch.uint8)).tolist(),
      " (1 + 16*2, 3 + 16*4, 5)")

# %%
check("6.3")

# %% [markdown]
# ## Exercise 6.4 · Unpack them (~7 min)
#
# The inverse: each byte gives back two codes, its low nibble first. The caller says how many codes
# there were, `n`: for an odd `n` the last high nibble is the padding, and is dropped.
#
# Back to the 2-bit example: from 57 = `0b00111001`, keeping only bits 0–1 (a mask of `0b11`)
# gives 1; shifting right by 2 and masking again gives 2, then 3, then 0. A mask keeps a field,
# a shift brings a field down to bit 0; for the top field the shift alone is enough.

# %% exercise="6.4"
def unpack_int4(packed: Tensor, n: int) -> Tensor:
    """The inverse of pack_int4: unpack_int4(pack_int4(c), n) equals c for codes c with n in the last dimension.

    packed: uint8 [..., bytes], any leading dimensions; n: how many codes were packed (bytes is half of it,
    rounded up)
    -> codes: uint8 [..., n], in their original order (byte i gives codes 2i and 2i + 1, low nibble first);
    the padding code of an odd n is not returned. packed is left unchanged.
    """
    ### BEGIN SOLUTION
    pairs = torch.stack([packed & 0x0F, packed >> 4], dim=-1)  # [..., ceil(n / 2), 2]
    return pairs.reshape(*packed.shape[:-1], -1)[..., :n]
    ### END SOLUTION


# %% [markdown]
# <details><summary>Hint 1: a nudge</summary>
#
# You can get all the low nibbles as one tensor and all the high nibbles as another, each shaped
# like `packed`. The work is putting them back in the order low, high, low, high, ...
# </details>
#
# <details><summary>Hint 2: the idea</summary>
#
# Stack the two along a new last dimension (`[..., bytes, 2]`): flattening the last two dimensions
# then reads them alternately. Keep the first `n`.
# </details>


# %% [markdown]
# What a 256 × 256 matrix of `tiny` weighs in each form (codes, scales and zero points counted):

# %%
w_o = tiny.model.layers[0].self_attn.o_proj.weight.detach()  # [hidden, hidden]
codes4, scale4, zero4 = quantize_int4(w_o, 64)
packed4 = pack_int4(codes4)
assert torch.equal(unpack_int4(packed4, w_o.shape[1]), codes4)
for name, tensors in (("float32", [w_o]), ("int8", list(quantize_int8(w_o))),
                      ("int4, groups of 64", [packed4, scale4, zero4])):
    size = sum(t.numel() * t.element_size() for t in tensors)
    print(f"{name:>20}: {size / 1024:6.1f} KiB, {8 * size / w_o.numel():6.3f} bits per weight")

# %%
check("6.4")

# %% [markdown]
# ## Exercise 6.5 · The quantized linear layer (~12 min)
#
# `QuantizedLinear` keeps only the packed codes, the scales and the zero points, and rebuilds the
# weight in every forward, then computes the layer as `nn.Linear` would. Rebuilding means applying
# the concept's `ŵ = (q − z) s` to every weight, with the `s` and `z` **of its own group**: the
# scale's shape says how many groups a row has, and so how many inputs each group covers.
#
# Which group does an input belong to? In a row of 12 inputs with 3 groups, each group covers 4
# inputs: inputs 0–3 use scale 0, 4–7 scale 1, 8–11 scale 2, so input 9 uses scale 2. A tensor of
# 12 codes viewed as `[3, 4]` puts each group on a row of its own, beside its one scale.
#
# Unpack with your `unpack_int4` (the number of inputs is `x`'s last dimension). One trap: `q − z`
# in `uint8` wraps around below zero (`3 − 5 = 254`). Build `Ŵ` in `x`'s dtype, so that a bf16 model
# multiplies in bf16.
#
# Rebuilding a whole float matrix for every forward is the plain-PyTorch way, and not a fast one
# (you will measure it at the end). A fused kernel dequantizes a tile at a time, in registers,
# right before it multiplies (lab 07), behind this very interface.

# %% exercise="6.5"
def int4_linear(x: Tensor, packed: Tensor, scale: Tensor, zero: Tensor, bias: Tensor | None) -> Tensor:
    """nn.Linear's forward on int4 weights: the layer whose weight quantize_int4 and pack_int4 stored.

    x: [n, in] float32 or bfloat16; packed: uint8 [out, in / 2 rounded up] (pack_int4 of 6.2's codes);
    scale: float32 [out, groups]; zero: uint8 [out, groups] (6.2's, groups dividing in); bias: [out] or None.
    -> y: [n, out] in x's dtype (the weight rebuilt in x's dtype). in is x's last dimension. No input is
    modified; zero points larger than their codes must not wrap around.
    """
    ### BEGIN SOLUTION
    out_features, in_features = packed.shape[0], x.shape[-1]
    codes = unpack_int4(packed, in_features).reshape(out_features, scale.shape[1], -1).float()  # [out, groups, g]
    weight = ((codes - zero[..., None].float()) * scale[..., None]).reshape(out_features, in_features)
    return F.linear(x, weight.to(x.dtype), bias)  # [n, out]
    ### END SOLUTION


# %% [markdown]
# <details><summary>Hint 1: a nudge</summary>
#
# Three steps: codes back from the bytes, weights back from the codes, the layer from the weights.
# The middle one is the lesson: get every weight next to its own group's scale and zero point.
# </details>
#
# <details><summary>Hint 2: the idea</summary>
#
# View the unpacked codes as `[out, groups, group_size]`; give the `[out, groups]` scales and zero
# points one trailing dimension so they broadcast over each group; do the arithmetic in float
# (not uint8); view the result as `[out, in]` again; then the ordinary linear layer, with the bias.
# </details>
#
# <details><summary>Hint 3: the formula, as a last resort</summary>
#
# `Ŵ[o, i] = (q[o, i] − z[o, i // g]) · s[o, i // g]` with `g = in / groups`; `y = x Ŵᵀ + b`.
# </details>


# %% [markdown]
# The MLP's gate and up projections of layer 0 of `tiny` (1,536 outputs), quantized with three
# group sizes, on eight random inputs: how far do the outputs move? (The experiments below measure
# how much of it reaches the model's predictions.)

# %%
w_gate_up = tiny.model.layers[0].mlp.gate_up_proj.weight.detach()  # [2 * intermediate, hidden]
x_demo = torch.randn(8, w_gate_up.shape[1], generator=torch.Generator().manual_seed(6))
exact = F.linear(x_demo, w_gate_up)
for g in (32, 64, 128):
    codes4, scale4, zero4 = quantize_int4(w_gate_up, g)
    y = int4_linear(x_demo, pack_int4(codes4), scale4, zero4, None)
    print(f"groups of {g:3d}: output error {float((y - exact).norm() / exact.norm()):.2%} of the output's norm")

# %%
check("6.5")

# %% [markdown]
# ## Your codecs inside minillm (~3 min)
#
# `EngineConfig(quantization=QuantConfig(...))` quantizes the model as it loads: every projection
# of every decoder layer becomes a `QuantizedLinear` (the LM head stays in full precision unless
# named). The engine takes its codecs and its int4 forward from `EngineConfig.components`, so with
# `components=YOURS` below, your `quantize_int8`, `quantize_int4` and `pack_int4` build the
# quantized weights, and your `int4_linear` (calling your `unpack_int4`) computes with them.
#
# `check("6.E")` (also part of `make grade LAB=06`) builds `tiny` quantized to int4 with groups of
# 64, and to int8, once with your parts and once with the engine's: the logits must agree. Then it
# runs the workload of labs 02 to 04 (chunked prefill, prefix-cache hits, parallel samples,
# preemption) on the int4 `pico`: the tokens must be identical.

# %%
YOURS = Components(quantize_int8=quantize_int8, quantize_int4=quantize_int4, pack_int4=pack_int4,
                   int4_linear=int4_linear, source="this notebook")
check("6.E")

# %% [markdown]
# ## Measure it: quality against bits per weight (~8 min)
#
# What does each scheme cost in quality? The yardstick is held-out text: eight windows of 128 tokens
# from the files of the bundled corpus that `tiny` never trained on. For each candidate,
# `Reference.compare` (`minillm/experiments/quant_quality.py`) computes, on the same windows:
#
# * **perplexity**, `exp` of the mean next-token loss: what a benchmark reports;
# * **KL** from the full model, `Σ p_full (log p_full − log p_quant)` averaged over positions, in
#   nats: how far each next-token distribution moved. It sees changes that perplexity averages
#   away (a quantized model can even score a slightly *lower* perplexity by luck while every
#   distribution moved);
# * **top-1**: how often both models rank the same token first.
#
# Every projection of every layer is quantized; the embedding and the LM head (tied in `tiny`)
# stay in float32. The fp8 scheme (e4m3, one scale per row) is the engine's.

# %%
_, heldout_texts, _ = corpus_split()
tokenizer = Tokenizer.from_file(str(BUNDLED_DIR / "tiny" / "tokenizer.json"))
# The windows minillm.experiments.quant_quality.heldout_windows gives, without tokenizing the training split too.
heldout_ids = encode_corpus(tokenizer, heldout_texts)                  # the held-out files, one token stream
windows = spread_rows(heldout_ids, 8, 129)                             # [8, 128 + 1] token ids
reference = Reference(tiny, windows)

schemes = [QuantConfig("int8"), QuantConfig("fp8"), QuantConfig("int4", group_size=32),
           QuantConfig("int4", group_size=64), QuantConfig("int4", group_size=128)]
rows = [("float32", reference.quality, 32.0, linear_weight_bytes(tiny)["total"])]
for config in schemes:
    model = quantize_model(copy.deepcopy(tiny), config)
    sizes = linear_weight_bytes(model)
    bits = 8 * sizes["quantized"] / (sizes["quantized_fp32"] / 4)  # stored bits per quantized weight
    rows.append((config.label(), reference.compare(model), bits, sizes["total"]))
print(f"{'scheme':>10} {'bits/weight':>11} {'model MB':>9} {'perplexity':>10} {'KL (nats)':>10} {'top-1':>6}")
for name, quality, bits, total in rows:
    print(f"{name:>10} {bits:11.3f} {total / 1e6:9.2f} {quality.perplexity:10.3f} {quality.kl:10.5f} "
          f"{quality.top1:6.3f}")

# %%
fig = make_subplots(rows=1, cols=2, subplot_titles=("KL from the full model", "model size"))
quantized = rows[1:]
for name, quality, bits, _ in quantized:
    fig.add_trace(go.Scatter(x=[bits], y=[quality.kl], mode="markers", name=name, marker=dict(size=11)), row=1, col=1)
fig.add_trace(go.Bar(x=[r[0] for r in rows], y=[r[3] / 1e6 for r in rows], showlegend=False), row=1, col=2)
fig.update_xaxes(title_text="stored bits per quantized weight", row=1, col=1)
fig.update_yaxes(title_text="KL (nats per token)", type="log", dtick=1, exponentformat="power", row=1, col=1)
fig.update_yaxes(title_text="MB (the float32 embedding included)", row=1, col=2)
fig.update_layout(title="tiny: quality against bits per weight", height=380)
fig.show()

# %% [markdown]
# Read it from right to left. int8 moves the distributions very little. fp8 moves them more: e4m3
# keeps 3 bits of mantissa, so each weight is off by up to 1/16 of itself, while int8's step (the
# row's largest |w| / 127) is finer for all but the row's smallest weights, those under about 6% of
# the largest. int4 costs more again, and more the larger its groups: fewer scales, each stretched
# over more weights, so a larger step. Groups of 32 cost 5.25 bits per weight, groups of 128 only
# 4.31: the usual compromise is 64 or 128.
#
# Now compare the perplexity column with the KL column. int4 raises perplexity a little, but int8
# and fp8 may well come out *below* float32 on these windows: a tiny shift of the
# distributions happened to favour the right tokens of this sample, and another sample could say the
# opposite. KL cannot be fooled that way (it is 0 only when nothing moved), and it separates the
# schemes clearly: that is why the rest of this lab measures KL.
#
# The size panel has a lesson too: `tiny`'s embedding (4,096 × 256, tied to its LM head) is a
# fifth of its weights and stays in float32, so int4 shrinks the whole model less than its
# matrices. In a model of billions of parameters the layers dominate, and the ratio approaches
# bits per weight over 16 (bf16).

# %% [markdown]
# ## Measure it: on a real model (~10 min)
#
# `tiny` was trained here, in float32. **SmolLM2-135M-Instruct** (30 layers, 135M parameters) was
# trained elsewhere and *distributed at 4 bits*: its GGUF file stores every projection in
# llama.cpp's **Q4_1** format. Q4_1 cuts each row into blocks of 32 consecutive inputs and gives
# each block a float16 step `d` and a float16 minimum `m`; a weight is `m + d·q`, with `q` in 0..15.
# minillm's loader turned those into float32, so "full precision" below means these float32
# values, and each block of 32 already holds at most 16 distinct values, all on one evenly spaced
# grid. That changes what requantizing does:
#
# * **Groups of 32** are the blocks themselves (the same 32 consecutive inputs). A codec shaped
#   like Q4_1, a float minimum and a step per group taken from the group's minimum and maximum,
#   finds each block's grid again.
# * **Groups of 64 or more** straddle blocks that had different grids. One grid of 16 levels has to
#   serve them all, and weights move. (128 does not divide 576, the inputs of every projection but
#   the MLP's down projection, so the largest group here is 192.)
# * **Your int4 codec is shaped differently**: its zero point is a whole code and its range always
#   holds 0, so its levels are `scale·(q − zero)`, with one at 0 where Q4_1 had one at `m`. In a
#   block with weights of both signs the step comes out the same (`scale = d`), but the levels sit
#   shifted by the fraction of a step between `m` and the nearest multiple of `d`: every weight of
#   the block moves by that same amount, up to half a step.
#
# First the quality of the whole model, with the engine's codecs as in the table above: perplexity,
# KL and top-1 against the float32 model, on two windows of 128 tokens of the same held-out files
# (now in SmolLM2's own tokens). It takes about a minute on a 2-core CPU; if the model is not
# installed, the cell tells you how to install it and skips.

# %%
from minillm.labkit import REAL_MODEL, quick_run, real_model_installed

REAL = REAL_MODEL
real_installed = real_model_installed()
if real_installed:
    real_llm = LLM(REAL, num_kv_blocks=8)
    real = real_llm.engine.model
    real_ids = torch.tensor(real_llm.tokenizer.encode("\n".join(heldout_texts)[:20_000]))
    real_reference = Reference(real, spread_rows(real_ids, 2, 129))           # windows [2, 128 + 1]
    real_groups = [32, 64, 192]
    real_rows = [("float32", real_reference.quality)]
    for config in [QuantConfig("int8")] + [QuantConfig("int4", group_size=g) for g in real_groups]:
        model = quantize_model(copy.deepcopy(real), config)
        real_rows.append((config.label(), real_reference.compare(model)))
        del model  # 540 MB: one copy at a time
    print(f"{REAL}, {real_reference.quality.tokens} positions\n")
    print(f"{'scheme':>10} {'perplexity':>10} {'KL (nats)':>10} {'top-1':>6}")
    for name, quality in real_rows:
        print(f"{name:>10} {quality.perplexity:10.3f} {quality.kl:10.5f} {quality.top1:6.3f}")

# %% [markdown]
# Now the weights themselves: how far requantizing moves them, `mean |ŵ − w| / mean |w|`, with your
# `quantize_int4` (and the engine's `dequantize_int4`) and with a Q4_1-shaped codec written in four
# lines below, at each group size. Three of the 30 layers (the first, a middle one, the last) keep
# it quick.

# %%
def float_min_roundtrip(w: Tensor, group_size: int) -> Tensor:
    """Q4_1's shape: per group, level = lo + step·q, lo = min(group), step = (max - min) / 15, q in 0..15.
    w: [out, in] -> the requantized weights [out, in]."""
    groups = w.reshape(w.shape[0], -1, group_size)                         # [out, groups, g]
    lo, hi = groups.amin(-1, keepdim=True), groups.amax(-1, keepdim=True)
    step = ((hi - lo) / INT4_MAX).clamp_min(TINY)
    return (torch.round((groups - lo) / step) * step + lo).reshape(w.shape)


if real_installed:
    sampled = [name for name, p in real.named_parameters() if p.dim() == 2 and "embed" not in name
               and any(f"layers.{i}." in name for i in (0, 15, 29))]
    weights = {name: real.get_parameter(name).detach() for name in sampled}
    size = sum(float(w.abs().sum()) for w in weights.values())
    codecs = {"your int4 (whole zero point, range holds 0)": lambda w, g: dequantize_int4(*quantize_int4(w, g)),
              "Q4_1-shaped (float minimum)": float_min_roundtrip}
    moved = {name: {g: sum(float((f(w, g) - w).abs().sum()) for w in weights.values()) / size for g in real_groups}
             for name, f in codecs.items()}
    print(f"{len(weights)} matrices of layers 0, 15 and 29; relative error of the requantized weights:")
    print(f"{'codec':>45} " + " ".join(f"{f'g{g}':>8}" for g in real_groups))
    for name, by_group in moved.items():
        print(f"{name:>45} " + " ".join(f"{by_group[g]:8.5f}" for g in real_groups))

    fig = make_subplots(rows=1, cols=2, subplot_titles=("KL from the float32 model (engine's codecs)",
                                                        "weights moved by requantizing, layers 0, 15, 29"))
    fig.add_trace(go.Bar(x=[n for n, _ in real_rows[1:]], y=[q.kl for _, q in real_rows[1:]], showlegend=False),
                  row=1, col=1)
    for name, by_group in moved.items():
        fig.add_trace(go.Bar(name=name, x=[f"groups of {g}" for g in real_groups], y=list(by_group.values())),
                      row=1, col=2)
    fig.update_yaxes(title_text="KL (nats per token)", row=1, col=1)
    fig.update_yaxes(title_text="mean |ŵ − w| / mean |w|", row=1, col=2)
    fig.update_layout(title=f"{REAL}: requantizing weights that were distributed at 4 bits (Q4_1, blocks of 32)",
                      height=400, legend=dict(orientation="h", y=-0.2))
    fig.show()

# %% [markdown]
# The Q4_1-shaped codec at 32 puts every weight back where it was: requantizing in the format the
# weights came in, block for block, costs nothing. At 64 and 192 the same codec moves the weights,
# since each group now mixes blocks with different grids. Your codec moves them even at 32, by
# the shift described above, and more as the groups grow: the KL of int4 in the table grows with the
# group size in the same way (perplexity, on 256 positions, is the noisier yardstick, as above).
# int8, with 255 levels per row, stays close to the float32 model.
#
# The lesson carries to real deployments. A checkpoint you download may already be quantized
# (GGUF, GPTQ and AWQ files are), and quantizing it again stacks a second rounding on the first
# unless the second format can express the first: same blocks, same kind of grid. When it cannot,
# start from the original 16-bit weights.

# %% [markdown]
# ## Exercise 6.6 · Which layers are sensitive? (~10 min)
#
# The average hides where the error comes from. Quantize **one decoder layer at a time** (every
# other layer stays full precision) and measure each against the reference: a layer whose
# quantization moves the output a lot deserves more bits, a robust one fewer. This is how mixed
# precision policies are chosen.
#
# Use the engine's pieces: `quantize_model(model, config)` quantizes a model **in place** (so
# quantize a `copy.deepcopy` of it, and leave `model` as it was), `replace(base, layers=(i,))`
# (from `dataclasses`) is `base` with only layer `i` picked, and `reference.compare(model)` gives
# the `Quality`. Keep everything else of `base`: its scheme, group size and projections.

# %% exercise="6.6"
def layer_sensitivity(model: nn.Module, reference: Reference, base: QuantConfig) -> list[Quality]:
    """Quantize each decoder layer alone, as `base` says, and measure it: one Quality per layer.

    model: a full-precision minillm model (its layers are model.model.layers), left unchanged.
    reference: the full model's log-probabilities on held-out windows (Reference(model, windows)).
    base: the scheme, group size and projections to use, kept as they are except for the layers picked.
    -> [Quality of the model with only layer 0 quantized, only layer 1, ...], one per decoder layer,
    each measured by reference on a copy of model.
    """
    ### BEGIN SOLUTION
    return [reference.compare(quantize_model(copy.deepcopy(model), replace(base, layers=(i,))))
            for i in range(len(model.model.layers))]
    ### END SOLUTION


# %%
base = QuantConfig("int4", group_size=128)
per_layer = layer_sensitivity(tiny, reference, base)
for i, quality in enumerate(per_layer):
    spread = torch.tensor(quality.kl_per_window).std().item() / math.sqrt(len(quality.kl_per_window))
    print(f"layer {i}: KL {quality.kl:.5f} ± {spread:.5f} (standard error over the windows), top-1 {quality.top1:.3f}")

# %%
check("6.6")

# %% [markdown]
# Does one layer stand out in your run? (Each figure carries noise: the `±` is its standard error
# over the eight windows, computed from `Quality.kl_per_window`. Two layers whose intervals overlap
# cannot be told apart on this sample.)
#
# Now finer: each projection of each layer alone, int4 with groups of 128, the heatmap
# `minillm.experiments.quant_sensitivity.sensitivity_grid` measures (42 quantized copies of `tiny`).

# %%
projections = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
grid = sensitivity_grid(tiny, reference, base, projections)
layers = list(range(len(tiny.model.layers)))
z = [[grid[(i, p)].kl * 1e3 for p in projections] for i in layers]  # KL in thousandths of a nat
fig = go.Figure(go.Heatmap(z=z, x=[p.removesuffix("_proj") for p in projections], y=[f"layer {i}" for i in layers],
                           colorscale="Viridis", colorbar=dict(title="KL x 1000"),
                           text=[[f"{v:.2f}" for v in r] for r in z], texttemplate="%{text}"))
fig.update_layout(title="KL from the full model, one projection of one layer in int4 (groups of 128)",
                  xaxis_title="projection", yaxis_title="decoder layer", height=380)
fig.update_yaxes(autorange="reversed")
fig.show()

# %% [markdown]
# The sensitivity is far from even: a few cells carry most of it, and the sum over a row is
# roughly that layer's figure from 6.6. This is the picture behind mixed-precision recipes (keep
# the few sensitive matrices in 8 bits, the rest in 4), and behind methods like AWQ that protect
# the weights that matter most for the activations they see.

# %% [markdown]
# ## Exercise 6.7 · Do errors add up, or cancel? (~20 min)
#
# If each layer's rounding pushed the output in an unrelated direction, the error of quantizing
# layers A and B together would be about the sum of their errors alone. (For small changes KL is
# a quadratic form in the change of the logits: the cross term, the **interaction**, is what can
# make the total smaller than the sum.) The measured interaction of a pair is
#
# $$d = e(A \cup B) - e(A) - e(B).$$
#
# Negative: the errors partly **cancel**; positive: they compound. But every `e` is measured on a
# few windows, and is noisy. How do you tell a real negative interaction from noise?
#
# * **Pair the windows.** The windows are the same for every set, so compute the interaction
#   *window by window*, `d_w` on window `w`, not from the three averages. A hard window raises
#   every set's error together, and that shared swing drops out of each `d_w`.
# * **Compare the mean with its own uncertainty.** The mean of the `d_w` is the estimate; how much
#   it would wobble if you drew other windows is its **standard error**, estimated from the spread
#   of the `d_w` themselves (with few windows, the *sample* standard deviation: n − 1).
#   "Measurably negative" means: more than `z` standard errors below zero, strictly.
#
# A worked example on other numbers: a new build runs four benchmarks 0.03, 0.01, 0.02 and 0.02
# seconds faster than the old one, benchmark by benchmark. The mean gain is 0.02 s. Its spread is
# small, so its standard error is small too, well under 0.01 s: the gain stands more than z = 2
# standard errors away from zero. Had the four gains been 0.10, −0.06, 0.08, −0.04 (the same mean),
# the spread would swallow it. Work out the two standard errors yourself before you write the code.
#
# Search every split of every measured set `S` into two non-empty, disjoint measured sets `A` and
# `B` with `A ∪ B = S` (all three must be in `errors`). Report each pair once, with `A` the part
# that holds the smallest layer of `S`, strongest cancellation (most negative `d̄`) first.

# %% exercise="6.7"
def find_cancellations(errors: dict[frozenset[int], Sequence[float]], z: float = 2.0
                       ) -> list[tuple[frozenset[int], frozenset[int]]]:
    """The pairs of layer sets whose quantization errors measurably cancel, by the paired test above.

    errors: a frozenset of quantized layers -> its error on each of the same n >= 2 windows (a list or
    tuple of floats, KL per window); left unchanged. z: how many standard errors, > 0.
    Candidates: every measured S split into two non-empty, disjoint, measured A and B whose union is S.
    A pair cancels when the mean of its per-window interactions lies more than z standard errors below
    zero, strictly (exactly on the threshold does not); the standard error uses the sample standard
    deviation (n - 1). -> [(A, B), ...]: each pair once, A the part holding S's smallest layer, the most
    negative mean interaction first. Nothing to split gives [].
    """
    ### BEGIN SOLUTION
    found = []
    for s in errors:
        for a in errors:
            b = s - a
            if not (a and a < s and min(s) in a and b in errors):
                continue
            d = torch.tensor(errors[s], dtype=torch.float64) - torch.tensor(errors[a], dtype=torch.float64) \
                - torch.tensor(errors[b], dtype=torch.float64)  # [n]: the interaction on each window
            if d.mean() < -z * d.std() / math.sqrt(len(d)):
                found.append((float(d.mean()), a, b))
    return [(a, b) for _, a, b in sorted(found, key=lambda f: f[0])]
    ### END SOLUTION


# %% [markdown]
# <details><summary>Hint 1: a nudge</summary>
#
# Two loops: over the measured sets `S`, and over the measured sets that could be one part of `S`.
# The other part is then fixed. Skip a candidate unless both parts are measured, non-empty, and the
# first holds `S`'s smallest layer (that is what makes each pair appear once).
# </details>
#
# <details><summary>Hint 2: the idea</summary>
#
# Python's sets compare by inclusion (`<` is "proper subset") and subtract. For a candidate, build
# the per-window interactions as one float64 tensor, then its mean and its standard error; keep
# `(mean, A, B)` when it passes, and sort by the mean at the end. PyTorch's standard deviation
# already divides by n − 1.
# </details>
#
# <details><summary>Hint 3: the formula, as a last resort</summary>
#
# `d_w = e(S)_w − e(A)_w − e(B)_w`, `d̄ = mean(d)`, `se = sd(d) / √n`; the pair cancels when `d̄ < −z · se`.
# </details>


# %% [markdown]
# A made-up example over three windows, the third much harder than the others: every set's error
# swings with it. Yet layers 0 and 1 together lose a steady 0.04 or 0.05 to the sum of each alone,
# window after window, while layers 0 and 2 compound on one window and cancel on another.

# %%
example = {frozenset({0}): [0.10, 0.20, 0.90], frozenset({1}): [0.05, 0.10, 0.60],
           frozenset({0, 1}): [0.11, 0.26, 1.45], frozenset({2}): [0.02, 0.04, 0.10],
           frozenset({0, 2}): [0.12, 0.30, 0.95]}
for a, b in ((0, 1), (0, 2)):
    d = [ab - ea - eb for ab, ea, eb in zip(example[frozenset({a, b})], example[frozenset({a})],
                                            example[frozenset({b})])]
    print(f"layers {a} and {b}: interaction per window {[round(v, 3) for v in d]}")
print("find_cancellations:", find_cancellations(example))

# %%
check("6.7")

# %% [markdown]
# Now on `tiny`: every layer alone (6.6 measured them) and every pair of layers (15 more quantized
# copies), int4 with groups of 128, KL per window. If errors simply added, each pair would sit on
# the diagonal of the plot below; the bars are ±2 standard errors of its interaction.

# %%
errors = {frozenset({i}): q.kl_per_window for i, q in enumerate(per_layer)}
for i in layers:
    for j in layers[i + 1:]:
        errors[frozenset({i, j})] = measure(tiny, reference, replace(base, layers=(i, j))).kl_per_window
pairs = [s for s in errors if len(s) == 2]
cancelling = find_cancellations(errors, z=2.0)
print(f"{len(cancelling)} of {len(pairs)} pairs cancel at z = 2:",
      ", ".join(f"layers {sorted(a)} and {sorted(b)}" for a, b in cancelling) or "none")


def mean(values) -> float:
    return sum(values) / len(values)


def interaction(pair: frozenset) -> torch.Tensor:
    i, j = sorted(pair)
    return (torch.tensor(errors[pair]) - torch.tensor(errors[frozenset({i})]) - torch.tensor(errors[frozenset({j})]))


found = {a | b for a, b in cancelling}
fig = go.Figure()
for kind, members, color in (("cancel (z = 2)", [s for s in pairs if s in found], "#e4572e"),
                             ("no evidence", [s for s in pairs if s not in found], "#3d6fb6")):
    if not members:
        continue
    predicted = [sum(mean(errors[frozenset({i})]) for i in s) for s in members]
    bars = [2 * interaction(s).std().item() / math.sqrt(len(windows)) for s in members]
    fig.add_trace(go.Scatter(x=predicted, y=[mean(errors[s]) for s in members], mode="markers", name=kind,
                             marker=dict(color=color, size=9), error_y=dict(type="data", array=bars),
                             text=[f"layers {sorted(s)}" for s in members]))
line = [min(mean(errors[s]) for s in pairs) * 0.95, max(mean(errors[s]) for s in pairs) * 1.05]
fig.add_trace(go.Scatter(x=line, y=line, mode="lines", line=dict(dash="dash", color="gray"), name="errors add up"))
fig.update_layout(title="Two layers in int4: measured KL against the sum of each alone", height=400,
                  xaxis_title="KL of layer i alone + KL of layer j alone", yaxis_title="KL of layers i and j together")
fig.update_xaxes(type="log")
fig.update_yaxes(type="log")
fig.show()

# %% [markdown]
# Errors mostly add up: the points hug the diagonal. Where the search flags a pair, the two layers
# together cost a few percent less than the sum of each alone: a **partial** cancellation, a
# negative interaction. Note what it is not: quantizing both layers still costs more than
# quantizing either one alone. A *full* cancellation, quantizing more and getting a lower error, is
# what `minillm/experiments/quant_cancellation.py` searches for, over nested sets of layers (its figures for
# `tiny` are in the record `docs/benchmarks/quant.json`, entry `sensitivity`, with the machine they were
# measured on).
#
# Two cautions before you build a policy on a flagged pair:
#
# * **Many tests, some false alarms.** At z = 2 a pair with no true interaction still passes by
#   chance about 2% of the time; over 15 pairs, expect a third of a false alarm. Demand a larger z
#   (the Bonferroni threshold for 15 tests at 5% is about 2.7), or confirm on fresh text.
# * **Cancellation is specific.** It depends on the scheme, the group size and the text; a pair
#   that cancels in int4-g128 need not in int4-g32.
#
# Fresh text, then: eight other windows of the held-out files, and the flagged pairs measured again.

# %%
fresh = Reference(tiny, spread_rows(heldout_ids[len(heldout_ids) // 16:], 8, 129))  # 8 windows, none seen above
for a, b in cancelling:
    again = {s: measure(tiny, fresh, replace(base, layers=tuple(sorted(s)))).kl_per_window for s in (a, b, a | b)}
    d = torch.tensor(again[a | b]) - torch.tensor(again[a]) - torch.tensor(again[b])  # [8]
    se = d.std().item() / math.sqrt(len(d))
    print(f"layers {sorted(a)} and {sorted(b)} on fresh windows: interaction {d.mean().item():.2e} ± {se:.1e} "
          f"(z = {d.mean().item() / se:.1f}): {'cancels again' if find_cancellations(again) else 'not significant'}")
if not cancelling:
    print("no pair was flagged: nothing to confirm")

# %% [markdown]
# A real interaction keeps its sign on other text; a false alarm is as likely to flip as not, and
# rarely passes twice. Read your own run above: a pair that keeps its sign at a smaller z is a small
# effect at the edge of what eight windows can show, and more windows would settle it.
#
# `minillm/experiments/quant_sensitivity.py` also grows sets of layers in several orders (most sensitive first,
# least sensitive first, random): a quick way to see whether the error of *all* layers is the sum
# of the parts, which for `tiny` it nearly is.

# %% [markdown]
# ## Why weight-only quantization speeds up decode, and not prefill (~8 min)
#
# Lab 00's roofline: a step takes at least `max(FLOPs / peak, bytes / bandwidth)`. Weight-only
# quantization changes only the bytes of the weights: the arithmetic still runs in bf16 (the
# weights are dequantized on the way in), so the FLOPs and the peak stay the same.
#
# * A **decode** step at batch 1 does 2 FLOPs per weight and reads each weight once: its intensity
#   is about 1 FLOP per byte in bf16, far below a GPU's ridge (hundreds). It is bound by the bytes,
#   and int4 divides them by almost 4.
# * A **prefill** of 2,048 tokens does 2 FLOPs per weight *per token* for one read of each weight:
#   thousands of FLOPs per byte, compute-bound. Fewer bytes change nothing; only faster arithmetic
#   would (FP8 or INT8 tensor cores, with the activations quantized too: W8A8).
#
# Llama-3.1-8B on an H100, by `minillm.perf`'s roofline (KV cache in bf16, 1,024 tokens of context
# for decode; fp32 weights computed in fp32, all others in bf16):

# %%
llama, h100 = model_shape("Llama-3.1-8B"), PROFILES["H100 SXM"]
FORMATS = {"fp32": (32.0, "float32"), "bf16": (16.0, "bfloat16"), "int8": (8.0, "bfloat16"),
           "int4-g64": (4.625, "bfloat16")}  # bits per weight (scales included), the arithmetic's dtype


def step_cost(phase: str, tokens: int, bits: float) -> OpCost:
    """One step of Llama-3.1-8B at batch 1, weights stored at `bits` per weight, KV cache in bf16."""
    step = decode_cost if phase == "decode" else prefill_cost
    cost = step(llama, 1, tokens, "bfloat16")
    weights = param_count(llama)
    return OpCost(cost.flops, cost.bytes - 2 * weights + weights * bits / 8, cost.tokens)


points, costs = {}, {}
for phase, tokens in (("decode", 1024), ("prefill", 2048)):
    for name, (bits, dtype) in FORMATS.items():
        cost, peak = step_cost(phase, tokens, bits), h100.peak(dtype)
        compute_s, memory_s = cost.flops / peak, cost.bytes / h100.bandwidth
        costs[(phase, name)] = (cost, max(compute_s, memory_s), "compute" if compute_s >= memory_s else "memory")
        points[(phase, name)] = (cost.intensity, min(peak, cost.intensity * h100.bandwidth))
print(f"{'step':>8} {'format':>9} {'GB moved':>9} {'FLOP/byte':>10} {'bound':>8} {'ms':>8} {'vs bf16':>8}")
for (phase, name), (cost, seconds, kind) in costs.items():
    speedup = costs[(phase, "bf16")][1] / seconds
    print(f"{phase:>8} {name:>9} {cost.bytes / 1e9:9.2f} {cost.intensity:10.1f} {kind:>8} {seconds * 1e3:8.2f} "
          f"{speedup:7.2f}x")

# %%
intensity = torch.logspace(-0.5, 4.5, 200)
fig = go.Figure()
for dtype, dash in (("bfloat16", "solid"), ("float32", "dot")):
    roof = [min(h100.peak(dtype), float(i) * h100.bandwidth) / 1e12 for i in intensity]
    fig.add_trace(go.Scatter(x=intensity.tolist(), y=roof, mode="lines", line=dict(dash=dash, color="gray"),
                             name=f"H100 roof, {dtype} arithmetic"))
COLORS = ("#8a5cf6", "#3d6fb6", "#2a9d8f", "#e4572e")
for phase, symbol in (("decode", "circle"), ("prefill", "diamond")):
    for k, name in enumerate(FORMATS):
        x, y = points[(phase, name)]
        fig.add_trace(go.Scatter(x=[x], y=[y / 1e12], mode="markers", name=f"{phase}, {name}",
                                 marker=dict(symbol=symbol, size=11, color=COLORS[k])))
fig.update_xaxes(type="log", title_text="arithmetic intensity (FLOP per byte moved)")
fig.update_yaxes(type="log", title_text="attainable TFLOP/s")
fig.update_layout(title="Llama-3.1-8B on an H100: fewer bits move decode up the memory roof", height=420)
fig.show()

# %% [markdown]
# The decode points climb the slanted, memory-bound part of the roof as the bits shrink: each
# halving of the bytes doubles the attainable FLOP/s, and the step's time halves. The prefill points
# sit on the flat compute roof (the fp32 one on its lower roof), where the weights' bytes do not
# matter. Batching moves decode to the right too: at batch 64 a decode step does 64 times the
# FLOPs for the same weight bytes, and the gain of int4 shrinks as it nears the ridge. That is why
# weight-only int4 shines for a few users at a time, and why servers with large batches turn to
# FP8 arithmetic instead.

# %% [markdown]
# ## Measure it: your parts in the engine, on this CPU (~7 min)
#
# Now the real engine, with your codecs and your int4 linear layer. First: does `tiny` still
# write the same text? Then the time of a decode step at batch 1: float32, int8 (the engine's
# `scaled_linear`, which scales after the product), and int4 with groups of 64, the engine's forward
# and yours.

# %%
prompt = tokenizer.encode("def fibonacci(n):\n    ").ids
greedy = SamplingParams(max_tokens=48, temperature=0, ignore_eos=True)


def decode_step_times(engines: dict[str, LLM], ids: list[int], rounds: int = 3) -> dict[str, float]:
    """Median seconds of a decode step at batch 1 for each engine, over `rounds` generations of 48 tokens
    after the prompt `ids`, the engines taking turns (so that a busy moment of the machine slows them all alike)."""
    steps = {name: [] for name in engines}
    for name, llm in engines.items():
        llm.engine.subscribe(lambda e, name=name: steps[name].append(e.duration)
                             if all(w.phase == "decode" for w in e.scheduled) else None)
    for _ in range(rounds):
        for llm in engines.values():
            llm.generate([ids], greedy, use_tqdm=False)
    return {name: sorted(times)[len(times) // 2] for name, times in steps.items()}


int4_g64 = QuantConfig("int4", group_size=64)
engines = {"float32": LLM("tiny"), "int8": LLM("tiny", quantization=QuantConfig("int8")),
           "int4-g64, the engine's": LLM("tiny", quantization=int4_g64),
           "int4-g64, yours": LLM("tiny", quantization=int4_g64, components=YOURS)}
texts = {name: llm.generate([prompt], greedy, use_tqdm=False)[0].token_ids for name, llm in engines.items()}
print("your int4 engine writes the engine's int4 tokens:", texts["int4-g64, yours"] == texts["int4-g64, the engine's"])
print("int4 tokens equal to float32's:", sum(a == b for a, b in zip(texts["int4-g64, yours"], texts["float32"])),
      "of", len(texts["float32"]))
step_s = decode_step_times(engines, prompt)
for name, seconds in step_s.items():
    print(f"{name:>24}: {seconds * 1e3:6.2f} ms per decode step ({step_s['float32'] / seconds:.2f}x float32's "
          f"tokens/s)")
tiny_bytes = {name: linear_weight_bytes(llm.engine.model)["linear"] for name, llm in engines.items()}
print("\nbytes-only bound (float32's bytes per token over the scheme's, the LM head in float32 in all): " + ", ".join(
    f"{name} up to {tiny_bytes['float32'] / tiny_bytes[name]:.2f}x" for name in engines if name != "float32"))

# %% [markdown]
# Compare your figures with the bytes-only line printed under them. On `tiny` they need not follow
# it, in either direction:
#
# * `tiny`'s 23 MB of weights can stay in the CPU's caches from one step to the next, so its steps
#   hardly wait on main memory. The time goes to arithmetic and to the rest of a step (norms,
#   attention, Python), and the engine's int8 and int4 rows run a different product from float32's
#   (the fused CPU kernel described below), so they can come out faster or slower than the bytes
#   alone say.
# * Your `int4_linear`, like the engine's plain-PyTorch reference, unpacks and dequantizes the whole
#   matrix into a fresh float32 tensor in every forward, then multiplies. That writes and reads
#   *more* bytes than the float32 weight alone.
#
# A layer the size of a large model's makes the second point plain: one 4096 × 4096 projection at
# batch 1, whose float32 weight (64 MB) does not fit in the caches.

# %%
w_big = torch.randn(4096, 4096, generator=torch.Generator().manual_seed(0)) * 0.02
x_one = torch.randn(1, 4096)
q_big, s_big = quantize_int8(w_big)
codes_big, scale_big, zero_big = quantize_int4(w_big, 64)
packed_big = pack_int4(codes_big)
layer_ms = {
    "float32 weight (64 MB)": median_time(lambda: F.linear(x_one, w_big), repeats=5),
    "int8 (16 MB), converted each call": median_time(lambda: scaled_linear(x_one, q_big, s_big, None), repeats=5),
    "int4-g64 (9 MB), your int4_linear": median_time(lambda: int4_linear(x_one, packed_big, scale_big, zero_big, None),
                                                     repeats=5),
}
for name, seconds in layer_ms.items():
    print(f"{name:>36}: {seconds * 1e3:7.2f} ms")
int4_over_fp32 = layer_ms["int4-g64 (9 MB), your int4_linear"] / layer_ms["float32 weight (64 MB)"]
print(f"your int4_linear took {int4_over_fp32:.1f}x the float32 layer's time, reading a seventh of its bytes")
fig = go.Figure(go.Bar(x=list(layer_ms), y=[s * 1e3 for s in layer_ms.values()]))
fig.update_layout(title="One 4096 x 4096 linear layer at batch 1 on this CPU, without a fused kernel",
                  yaxis_title="ms per call", height=320)
fig.show()

# %% [markdown]
# Dequantizing on the fly in plain PyTorch turns a 9 MB read into several temporary 64 MB float32
# matrices (the codes as floats, minus the zero points, times the scales), each written and read
# again: compare its time with the float32 layer's, printed above. The memory saving
# is real (the model takes a quarter of the space), the speed-up is not, until the dequantization
# moves *into* the matrix multiplication: a kernel that loads packed 4-bit tiles, unpacks and
# scales them in registers, and multiplies at once never writes the float matrix at all. That is
# what GPU kernels such as Marlin and the int4 dequant-matmul of lab 07 do, and where the roofline's
# near-4x for decode becomes a measurement.
#
# The engine's quantized layers do that on a CPU too: `minillm/quant/fused_matvec.cpp` reads the int8 codes, or
# the packed int4 codes with their scales and zero points, converts them to floats in registers and multiplies,
# one row of weights at a time, never writing a float32 matrix (the plain-PyTorch path, yours included, stays its
# reference in the tests). On `tiny` that saves little, since its weights sit in the caches.

# %% [markdown]
# ## Predict, then measure: each scheme on SmolLM2 against its bandwidth bound (~15 min)
#
# SmolLM2-135M's float32 weights do not fit in any cache: every decode step streams them from main
# memory. At batch 1 a step reads each matrix it multiplies once: the projections of its 30 layers and
# the LM head (SmolLM2's head is its embedding matrix, 49,152 × 576, read whole for every token's logits).
# So a step cannot take less than those **bytes per token** divided by the machine's memory bandwidth,
# which the next cells measure as lab 00 did (a large copy). Each scheme has its own bound: fewer bytes,
# a higher ceiling. The schemes, all on the engine's fused kernel:
#
# * **float32**: 4 bytes a weight;
# * **int8**: the layers in int8 (a byte a weight and a float32 scale per row), the head in float32;
# * **int8+head**: the head in int8 too;
# * **int4-g32-minmax+head**: min-max int4 at groups of 32 (the grid the model was distributed on),
#   the head included.
#
# Beside each speed, its quality on the held-out windows (`Reference.compare`, as above): a scheme
# that is fast but moves the distributions a lot is no bargain.
#
# **Before you run it**, work out int8's speedup over float32 from the bytes alone: count the bytes a
# token reads in each (the layers' share and the head's share of SmolLM2's 135M parameters: lab 00's
# `param_count` or the shapes above), and take their ratio. Then write it down.

# %%
MY_PREDICTION = None  # x: int8's decode speedup over float32 on SmolLM2, from the bytes per token of each

# %%
if real_installed:
    from minillm.perf.machine import machine, measure_bandwidth
    from minillm.quant.quant_config import PROJECTIONS  # every projection, the LM head included

    bandwidth = measure_bandwidth(torch.device("cpu"))  # bytes/s, with this notebook's torch threads
    real_schemes = {"int8": QuantConfig("int8"), "int8+head": QuantConfig("int8", projections=PROJECTIONS),
                    "int4-g32-minmax+head": QuantConfig("int4", group_size=32, int4_range="min-max",
                                                        projections=PROJECTIONS)}
    real_engines = {"float32": real_llm} | {name: LLM(REAL, real, num_kv_blocks=8, quantization=config)
                                            for name, config in real_schemes.items()}  # each a quantized copy
    per_token = {name: linear_weight_bytes(llm.engine.model)["linear"] for name, llm in real_engines.items()}
    real_quality = {name: (real_reference.quality if name == "float32" else real_reference.compare(llm.engine.model))
                    for name, llm in real_engines.items()}
    real_prompt = real_llm.tokenizer.encode("def fibonacci(n):\n    ")
    real_steps = decode_step_times(real_engines, real_prompt, rounds=1 if quick_run() else 3)
    print(f"{machine()}: copy bandwidth {bandwidth / 1e9:.1f} GB/s\n")
    print(f"{'scheme':>22} {'MB/token':>9} {'bound tok/s':>11} {'measured':>9} {'of bound':>8} {'KL (nats)':>10} "
          f"{'top-1':>6}")
    for name, seconds in real_steps.items():
        bound = bandwidth / per_token[name]
        print(f"{name:>22} {per_token[name] / 1e6:9.1f} {bound:11.1f} {1 / seconds:9.1f} {1 / seconds / bound:8.0%} "
              f"{real_quality[name].kl:10.5f} {real_quality[name].top1:6.3f}")

# %%
if real_installed:
    from minillm.labkit import compare

    int8_theory = per_token["float32"] / per_token["int8"]
    int8_measured = real_steps["float32"] / real_steps["int8"]
    compare("int8's decode speedup over float32, SmolLM2 at batch 1", MY_PREDICTION, theory=int8_theory,
            measured=int8_measured, unit="x", theory_name="bytes ratio (bandwidth bound)",
            gap="below the bytes ratio: what a step does besides reading weights (norms, attention, the Python around "
                "121 products, turning each code into its weight) did not shrink with the bytes.")
    names = list(real_steps)
    fig = go.Figure([go.Bar(name="bandwidth bound", x=names, y=[bandwidth / per_token[n] for n in names],
                            marker_color="#bbbbbb"),
                     go.Bar(name="measured", x=names, y=[1 / real_steps[n] for n in names], marker_color="#3d6fb6",
                            text=[f"KL {real_quality[n].kl:.4f}" for n in names], textposition="outside")])
    fig.update_layout(title=f"{REAL}: decode tokens/s at batch 1 against each scheme's bandwidth bound",
                      yaxis_title="tokens/s", barmode="group", height=380)
    fig.show()
    del real_engines

# %% [markdown]
# Read your table from top to bottom. Each scheme reads fewer bytes a token, and on SmolLM2 that is
# time: the quantized schemes should sit above float32's speed. But compare each with its own bound:
# which one reaches the smallest share of it in your run? The rest of a step did not shrink: the norms,
# attention and the Python around 121 matrix products; and turning each code into its weight is
# arithmetic the float32 product does not do. At one row of x it costs about as much as the multiply-add
# itself, so int4's kernel can run out of arithmetic before it runs out of memory bandwidth. Quantizing
# the head pays more than its share of the parameters suggests: it is a fifth of float32's bytes per
# token, read for every token. The KL column says what each step down costs in quality.
#
# ## How production engines do it (~5 min)
#
# * **Better rounding, same format.** Rounding each weight to its nearest level is the simplest
#   choice, not the best. **GPTQ** (Frantar et al. 2022) quantizes a matrix one column at a time
#   and updates the columns not yet quantized to compensate each column's error, guided by
#   second-order information from calibration activations. **AWQ** (Lin et al. 2023) finds the
#   input channels with large activations and scales their weights up before quantizing, so the
#   weights that matter most lose the least. Both produce ordinary int4 group-wise weights that the
#   same kernels run.
# * **Formats.** Group sizes of 64 or 128 with 16-bit scales are the common int4 choice.
#   llama.cpp's GGUF formats use blocks of 32 weights (Q4_0: a 16-bit scale per block, 4.5 bits per
#   weight) and "k-quants" with super-blocks of 256. QLoRA's **NF4** places its 16 levels at the
#   quantiles of a normal distribution instead of evenly, since weights are roughly normal.
# * **Outliers.** **LLM.int8()** (Dettmers et al. 2022) keeps the few activation channels with
#   outliers in 16 bits and the rest in int8. **SmoothQuant** (Xiao et al. 2022) moves activation
#   outliers into the weights with a per-channel scale, so both can be int8 (W8A8), which speeds
#   up prefill too, on int8 tensor cores.
# * **FP8.** Hopper and newer GPUs multiply in FP8 natively: FP8 weights *and* activations (the e4m3
#   format of the fp8 row above) halve both the bytes and the arithmetic time of bf16, with a
#   quality loss close to int8's. vLLM and SGLang serve FP8 checkpoints, and can store the KV cache
#   in FP8 too, which halves the memory of long contexts.
# * **Kernels.** Weight-only int4 pays off only with fused dequant-matmul kernels (Marlin, Machete,
#   ExLlama, llama.cpp's), which keep decode memory-bound on the 4-bit bytes; vLLM picks one by the
#   checkpoint's quantization method and the GPU.
