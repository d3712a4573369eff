# %% [markdown]
# # Lab 01 · A transformer from scratch
#
# **Time:** about 110 minutes in all (each section's heading gives its share). **You need:** Python, a
# little PyTorch (matrix products, softmax, broadcasting).
#
# A language model's forward pass is a short program: look up one vector per token, push the
# vectors through a stack of identical *decoder blocks*, and turn the last vectors into scores over
# the vocabulary. In this lab you write that program yourself, piece by piece, load the weights of
# the course's bundled model into it, then the weights of a real chat model, SmolLM2-135M-Instruct,
# and check that your logits match `minillm`'s up to float rounding.
#
# **See it live:** the visualizer's **Live engine** page (`make app`, under "The engine, live") streams
# requests through `minillm`'s engine; every step there runs the forward pass you write here.
# **Read more:** [docs/models.md](../docs/models.md): the bundled models, the real model, and how a
# Hugging Face checkpoint is loaded.
#
# ## Learning objectives
# By the end you can
# 1. write RMSNorm, rotary position embeddings (RoPE), causal grouped-query attention and the SwiGLU
#    MLP as plain tensor code;
# 2. explain why the causal mask must be *offset* when the queries are only the last few positions
#    (the situation a KV cache creates);
# 3. map query heads to key/value heads in grouped-query attention, and say what GQA saves;
# 4. read a Hugging Face checkpoint (`config.json` + `model.safetensors`) and run it with your own code,
#    the real SmolLM2 included;
# 5. predict the time of a forward pass from lab 00's FLOP count, then measure where it goes.
#
# ## How this lab works
# Write code only in the **exercise cells** (they contain `raise NotImplementedError`). Keep the
# function names and signatures: the grader calls them. Each docstring is the exercise's contract
# (shapes, what it must keep); the section above it builds the idea on other numbers, and the
# collapsed hints below it go from a nudge to the formula: open them only when you are stuck. Run the
# `check(...)` cell after each exercise for instant feedback; `make grade LAB=01` grades the whole
# notebook. Shapes are written `[q_len, heads, head_dim]`; every tensor here is float32 on the CPU.

# %% tags=["setup"]
import math

import torch
import torch.nn.functional as F
from torch import Tensor

from minillm.labkit import check
from minillm.models.model_config import ModelConfig

# %%
import plotly.graph_objects as go
from safetensors.torch import load_file

from minillm import LLM
from minillm.labkit import quick_run

MODEL = "tiny"  # the bundled model: a 6-layer Llama-style decoder trained on Python code
torch.manual_seed(0)

# %% [markdown]
# ## The concept: one decoder block (~5 min)
#
# Every Llama-family model (Llama, Qwen2, Mistral, SmolLM, and `minillm`'s bundled models) repeats
# the same *pre-norm* block `num_hidden_layers` times:
#
# ```
# x ─┬─ RMSNorm ─ attention (RoPE on q, k; causal; grouped-query) ─ o_proj ─(+)─┬─ RMSNorm ─ SwiGLU MLP ─(+)─► out
#    └──────────────────────────── residual ────────────────────────────────┘  └──────── residual ────────┘
# ```
#
# Attention is the only place where tokens talk to each other; everything else works on each
# token's vector alone. Causality lives in one object, the **mask**: a query may look at keys at
# its own position and earlier. When a KV cache holds earlier tokens, the queries are only the
# *last* `q_len` of `kv_len` positions, and the mask's diagonal moves right. Here is the mask for 3
# new queries over 7 positions: by how much did the diagonal move?

# %%
q_len, kv_len = 3, 7
query_positions = torch.arange(kv_len - q_len, kv_len)
allowed = query_positions[:, None] >= torch.arange(kv_len)[None, :]  # [q_len, kv_len]
fig = go.Figure(go.Heatmap(z=allowed.int(), x=[f"key {j}" for j in range(kv_len)],
                           y=[f"query at pos {p}" for p in query_positions.tolist()],
                           colorscale=[[0, "#eeeeee"], [1, "#2a6fdb"]], showscale=False, xgap=2, ygap=2))
fig.update_layout(title="Causal mask with a cache: blue = may attend", height=260, yaxis_autorange="reversed")
fig.show()

# %% [markdown]
# ## Exercise 1.1 · RMSNorm (~10 min)
#
# The residual stream's vectors grow and shrink from layer to layer; each half of a block wants its
# input at a fixed scale. RMSNorm measures a vector's size by its **root mean square**, divides it out,
# and then lets a learned gain `w` (one number per dimension) choose the scale. Step by step, on the
# vector `x = [3, -4, 0, 0]` with `w = [1, 2, 1, 0.5]`:
#
# 1. the mean of the squares: (9 + 16 + 0 + 0) / 4 = 6.25; its root, the RMS: 2.5;
# 2. divided by it: `[1.2, -1.6, 0, 0]`, a vector whose RMS is 1;
# 3. times the gain, entry by entry: `[1.2, -3.2, 0, 0]`.
#
# A vector of zeros has an RMS of 0, so a small `eps` joins the mean of the squares before the root
# is taken: with `eps = 0.25`, step 1 gives √6.5 ≈ 2.55 instead of 2.5. Checkpoints set their own
# `eps`; use the one you are given. Each token's vector is normalised on its own, over the hidden
# dimension only, whatever the leading dimensions are. Unlike LayerNorm there is no mean subtraction
# and no bias.

# %% exercise="1.1"
def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """RMSNorm: each vector along the last dim rescaled to unit root-mean-square, then scaled by `weight`.

    x: [..., hidden] float32, any number of leading dims; weight: [hidden], the learned gain;
    eps > 0, the given one (checkpoints differ), which keeps a vector of zeros finite.
    -> [..., hidden], x's shape; every vector normalised on its own, over hidden alone; no mean
    subtraction, no bias. x is not modified.
    """
    ### BEGIN SOLUTION
    inv_rms = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)  # [..., 1]
    return x * inv_rms * weight
    ### END SOLUTION


# %% [markdown]
# <details><summary>Hint 1: a nudge</summary>
#
# Redo the worked example in code on a tensor of 4 numbers first. Then give it shape `[2, 4]`: over
# which dimension must the mean go, and what shape must the RMS keep so that dividing by it works?
#
# </details>
# <details><summary>Hint 2: the idea</summary>
#
# Mean of the squares over the last dimension, keeping that dimension (so it is `[..., 1]` and
# broadcasts); add `eps`; take the root; divide `x` by it; multiply by `weight`.
#
# </details>
# <details><summary>Hint 3: the formula</summary>
#
# $$y = \frac{x}{\sqrt{\operatorname{mean}(x^2) + \varepsilon}} \odot w$$
#
# </details>

# %%
check("1.1")

# %% [markdown]
# ## Exercise 1.2 · The rotary tables (~12 min)
#
# RoPE encodes a token's position by *rotating* pairs of dimensions of q and k: the pair turns by an
# angle proportional to the position. One speed for every pair would repeat after a single turn, so
# the `head_dim / 2` pairs turn at speeds that fall geometrically: pair 0 at 1 radian per position,
# each next pair slower by a constant factor, chosen so that the speeds would reach `1 / theta` one
# pair past the last. Fast pairs tell nearby positions apart; slow ones, distant ones.
#
# A worked example with `head_dim = 8` and `theta = 10_000`: 4 pairs, each 10 times slower than the
# one before (10 = 10 000 to the power 1/4), so the speeds are 1, 0.1, 0.01, 0.001. At position 3 the
# pairs' angles are 3, 0.3, 0.03, 0.003 radians.
#
# Hugging Face's layout, which every checkpoint you will load follows, pairs dimension `i` with
# dimension `i + head_dim/2` ("rotate-half"). Both members of a pair need their angle, so a table row
# holds the angles twice, one copy per half: at position 3 in the example the row of angles is
# `[3, 0.3, 0.03, 0.003, 3, 0.3, 0.03, 0.003]`, and the tables hold its cosine and its sine.

# %% exercise="1.2"
def rope_cos_sin(positions: Tensor, head_dim: int, theta: float) -> tuple[Tensor, Tensor]:
    """Cosine and sine tables of the rotary angles at the given positions, in the rotate-half layout.

    positions: [n] integer positions, in any order, not necessarily 0 .. n-1; head_dim: even;
    theta: the RoPE base of the model's config (> 1).
    -> (cos, sin), each [n, head_dim] float32: row p belongs to positions[p], its first half holds the
    angles of pairs 0 (the fastest) to the last, and its second half repeats the first.
    """
    ### BEGIN SOLUTION
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)  # [head_dim / 2]
    angles = torch.outer(positions.float(), inv_freq)  # [n, head_dim / 2]
    angles = torch.cat([angles, angles], dim=-1)  # [n, head_dim]
    return angles.cos(), angles.sin()
    ### END SOLUTION


# %% [markdown]
# <details><summary>Hint 1: a nudge</summary>
#
# Build the `head_dim / 2` speeds first and compare them with the worked example: `head_dim = 8`,
# `theta = 10_000` must give 1, 0.1, 0.01, 0.001.
#
# </details>
# <details><summary>Hint 2: the idea</summary>
#
# Pair `i` turns at `theta` raised to minus (`i` over the number of pairs). Every position times every
# speed is an outer product, `[n, head_dim / 2]`; the row of angles is that, twice, along the last dim.
#
# </details>
# <details><summary>Hint 3: the formula</summary>
#
# $$\text{inv\_freq}_i = \theta^{-2i/\text{head\_dim}}, \quad i = 0, \dots, \tfrac{\text{head\_dim}}{2} - 1,
# \qquad \text{angle}_{p,i} = \text{positions}_p \cdot \text{inv\_freq}_i$$
#
# and each table is the cosine (sine) of `[angle, angle]`.
#
# </details>

# %%
check("1.2")

# %% [markdown]
# ## Exercise 1.3 · Applying RoPE (~12 min)
#
# Rotating a point `(a, b)` of the plane by an angle φ gives `(a cos φ − b sin φ, a sin φ + b cos φ)`:
# `(1, 0)` turned by 90° is `(0, 1)`. RoPE applies that to every pair of every head vector.
#
# In the rotate-half layout, pair `i` is `(x[i], x[i + d/2])`. Take `d = 4` and write
# `x = [a0, a1, b0, b1]`: the pairs are `(a0, b0)` and `(a1, b1)`, with angles φ0 and φ1, and the
# tables of 1.2 are `cos = [c0, c1, c0, c1]`, `sin = [s0, s1, s0, s1]`. Rotated, each pair by its angle:
#
# `[a0·c0 − b0·s0,  a1·c1 − b1·s1,  a0·s0 + b0·c0,  a1·s1 + b1·c1]`
#
# Half of every entry is `x · cos`, entry by entry. The other half is `(some vector) · sin`: find that
# vector, and you have the operation for any even `d`. Every head of a token turns by the same angles.
#
# Because both q and k are rotated, the score `q·k` depends only on the *distance* between their
# positions. That is why a cached key never needs rotating again. (The RoPE paper pairs adjacent
# dimensions `2i, 2i+1`; Hugging Face checkpoints permute their weights so that rotate-half is right
# for them. Mixing the two conventions is a classic silent bug.)

# %% exercise="1.3"
def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate every head vector of every token by its position's angles, in the rotate-half layout
    (dimension i pairs with dimension i + head_dim/2).

    x: [n, heads, head_dim] float32; cos, sin: [n, head_dim], the tables of rope_cos_sin, row t for
    token t; every head of a token turns by that token's angles.
    -> [n, heads, head_dim], a new tensor (x is not modified); each pair keeps its length.
    """
    ### BEGIN SOLUTION
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)  # [n, heads, head_dim]
    return x * cos[:, None, :] + rotated * sin[:, None, :]
    ### END SOLUTION


# %% [markdown]
# <details><summary>Hint 1: a nudge</summary>
#
# In the worked example, the vector multiplied by `sin` is `[−b0, −b1, a0, a1]`. How is it made from
# the two halves of `x`?
#
# </details>
# <details><summary>Hint 2: the idea</summary>
#
# Swap the two halves of the last dimension and negate the one that lands first. The tables are
# `[n, head_dim]` but `x` has a heads axis in between: give the tables a size-1 axis there so that they
# broadcast over the heads, not the tokens.
#
# </details>
# <details><summary>Hint 3: the formula</summary>
#
# $$\text{out} = x \odot \cos + \operatorname{rotate\_half}(x) \odot \sin, \qquad
# \operatorname{rotate\_half}([x_1, x_2]) = [-x_2, x_1]$$
#
# </details>

# %%
check("1.3")

# %% [markdown]
# ## Exercise 1.4 · Causal grouped-query attention (~20 min)
#
# Attention lets each query gather from the positions it may see, in four steps:
#
# 1. **Score** every key it may see by the dot product of query and key: high when they point the same way.
# 2. **Scale** the scores. The dot product of two random vectors with `head_dim` entries of size about
#    1 has a spread that grows like the square root of `head_dim`: for `head_dim = 16` about 4, for 256
#    about 16. Unscaled, long heads give scores so far apart that the next step puts all the weight on
#    one key. Scale them back to a spread of about 1.
# 3. **Normalise** the scores into weights that are positive and sum to 1 over the keys: a softmax
#    over the keys. A key the query may not see gets score −∞, hence weight exactly 0. Scores can reach
#    the hundreds (sharp attention), where `exp` overflows float32: normalise in a way that stays finite.
# 4. **Mix** the values with those weights: the output of a query is the weighted average of the values.
#
# Two details make this the engine's attention rather than the textbook's:
#
# * **The queries are the last positions.** `q` holds `q_len` queries and `k`, `v` hold `kv_len >= q_len`
#   positions: the queries are the *last* `q_len` of them (the mask above). With `q_len == kv_len` this
#   is the familiar lower triangle.
# * **Grouped-query attention (GQA).** There are fewer key/value heads than query heads, and each kv
#   head serves a group of consecutive query heads. With 8 query heads on 2 kv heads, query heads 0–3
#   read kv head 0 and heads 4–7 read kv head 1. The KV cache shrinks by the size of the group.

# %% exercise="1.4"
def causal_gqa_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Causal grouped-query attention of the last q_len positions of a sequence over all its kv_len positions.

    q: [q_len, heads, head_dim]; k, v: [kv_len, kv_heads, head_dim], kv_len >= q_len; heads a multiple
    of kv_heads; float32. -> [q_len, heads, head_dim], one output per query and query head.
    Rules it keeps: the q_len queries are the last q_len of the kv_len positions, in order; a query
    attends to every key at its own position or earlier, never a later one; consecutive query heads
    share a kv head, groups in order (the layout of every checkpoint); scores scaled as the section
    explains; finite (no inf, no NaN) when the scores reach the hundreds. q, k, v are not modified.
    """
    ### BEGIN SOLUTION
    q_len, heads, head_dim = q.shape
    kv_len, kv_heads, _ = k.shape
    group = heads // kv_heads
    k = k.repeat_interleave(group, dim=1)  # [kv_len, heads, head_dim]
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(head_dim)  # [heads, q_len, kv_len]
    query_pos = torch.arange(kv_len - q_len, kv_len)
    allowed = query_pos[:, None] >= torch.arange(kv_len)[None, :]  # [q_len, kv_len]
    probs = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    return torch.einsum("hqk,khd->qhd", probs, v)
    ### END SOLUTION


# %% [markdown]
# <details><summary>Hint 1: a nudge</summary>
#
# Get the textbook case right first: `q_len == kv_len` and as many kv heads as query heads. Write down
# the shape of the scores (one per head, query and key) before writing any code. Then add the groups,
# then the offset.
#
# </details>
# <details><summary>Hint 2: the idea</summary>
#
# Give k and v as many heads as q by repeating each kv head for its whole group, consecutively (not the
# whole set of kv heads tiled). Dot products over `head_dim` give `[heads, q_len, kv_len]` scores;
# divide by the spread of step 2. Query `i` sits at position `kv_len - q_len + i`: compare it with every
# key's position to build the mask, set the forbidden scores to −∞, normalise over the keys (PyTorch's
# softmax subtracts the maximum first, so it stays finite), then weight the values.
#
# </details>
# <details><summary>Hint 3: the formula</summary>
#
# $$\operatorname{Attention}(q, k, v) = \operatorname{softmax}\!\left(\frac{q k^\top}{\sqrt{d}} + M\right) v$$
#
# with `M = −∞` where the key's position is after `kv_len − q_len + i`, and query head `h` reading kv
# head `h // (heads // kv_heads)`.
#
# </details>

# %%
check("1.4")

# %% [markdown]
# ## Exercise 1.5 · The SwiGLU MLP (~8 min)
#
# The MLP widens each token's vector to `intermediate` dimensions, applies a nonlinearity, and
# narrows it back. Llama's is *gated*: two widening projections, the **gate** and the **up**
# projection; the gate's output goes through SiLU (`silu(z) = z · sigmoid(z)`, close to 0 for very
# negative z, close to z for large z) and then multiplies the up projection's output entry by entry,
# so the gate decides how much of each up-entry passes. The **down** projection narrows the product.
#
# A worked example for one token with `intermediate = 3`: if the gate gives `[1, -2, 0]` and the up
# projection `[3, 1, 2]`, SiLU of the gate is `[0.731, -0.238, 0]`, the product `[2.19, -0.238, 0]`, and
# the down projection turns that 3-vector back into a `hidden`-vector.
#
# Weights are stored as PyTorch's `nn.Linear` stores them, `[out_features, in_features]`: for a row of
# tokens `x: [n, in]`, applying `W` multiplies by its transpose.

# %% exercise="1.5"
def swiglu(x: Tensor, w_gate: Tensor, w_up: Tensor, w_down: Tensor) -> Tensor:
    """The gated feed-forward block (SwiGLU) of Llama-family models, applied to each token on its own.

    x: [n, hidden]; w_gate, w_up: [intermediate, hidden]; w_down: [hidden, intermediate], each stored
    as nn.Linear stores it ([out_features, in_features]); no biases. -> [n, hidden].
    SiLU acts on the gate projection's branch, not the up projection's. x is not modified.
    """
    ### BEGIN SOLUTION
    return F.linear(F.silu(F.linear(x, w_gate)) * F.linear(x, w_up), w_down)
    ### END SOLUTION


# %% [markdown]
# <details><summary>Hint 1: a nudge</summary>
#
# Follow the worked example with tensors: two projections, one activation, one product, one projection.
# Write each step's shape.
#
# </details>
# <details><summary>Hint 2: the idea</summary>
#
# `[n, hidden]` → `[n, intermediate]` twice (gate, up) → SiLU of the gate times the up, entry by entry →
# `[n, hidden]` through the down projection. PyTorch has SiLU and a linear layer's product as functions.
#
# </details>
# <details><summary>Hint 3: the formula</summary>
#
# $$\operatorname{MLP}(x) = \big(\operatorname{silu}(x W_\text{gate}^\top) \odot x W_\text{up}^\top\big)
# W_\text{down}^\top$$
#
# </details>

# %%
check("1.5")

# %% [markdown]
# ## Exercise 1.6 · A decoder block (~15 min)
#
# Put the pieces together along the diagram at the top of the lab. `w` holds one layer's tensors under
# their Hugging Face names (without the `model.layers.{i}.` prefix). Take every size from `cfg`:
# `cfg.num_attention_heads`, `cfg.num_key_value_heads`, `cfg.head_dim` (which need not equal
# `hidden_size / heads`), `cfg.rms_norm_eps`, `cfg.rope_theta`.
#
# Follow the shapes on a model of hidden 576 with 9 query heads on 3 kv heads of 64 dimensions (the
# real model you will load at the end) and `n` tokens: the normed input `[n, 576]`; `q_proj` gives
# `[n, 576]`, read as `[n, 9, 64]`; `k_proj` and `v_proj` give `[n, 192]`, read as `[n, 3, 64]`; attention
# gives `[n, 9, 64]`, flattened back to `[n, 576]` for `o_proj`. The two residual connections each add to
# the input of their half of the block, as the diagram draws them.
#
# The tokens are one whole sequence, token `i` at absolute position `positions[i]`: increasing, but not
# necessarily `0 .. n-1` (RoPE rotates by these positions; the causal mask is over the tokens in the
# order given).

# %% exercise="1.6"
def decoder_block(x: Tensor, positions: Tensor, w: dict[str, Tensor], cfg: ModelConfig) -> Tensor:
    """One pre-norm decoder layer (the diagram at the top of the lab) over one whole sequence, no cache.

    x: [n, hidden] float32; positions: [n] absolute positions, increasing, which may start above 0 and
    have gaps; w: one layer's tensors by their Hugging Face names without the `model.layers.{i}.`
    prefix: input_layernorm.weight, self_attn.{q,k,v,o}_proj.weight, post_attention_layernorm.weight,
    mlp.{gate,up,down}_proj.weight; cfg: every size and constant (heads, kv heads, head_dim,
    rms_norm_eps, rope_theta). -> [n, hidden].
    Uses your 1.1-1.5; RoPE turns q and k by `positions`; x and w are not modified.
    """
    ### BEGIN SOLUTION
    n, d = x.shape[0], cfg.head_dim
    a = rms_norm(x, w["input_layernorm.weight"], cfg.rms_norm_eps)
    q = F.linear(a, w["self_attn.q_proj.weight"]).view(n, cfg.num_attention_heads, d)
    k = F.linear(a, w["self_attn.k_proj.weight"]).view(n, cfg.num_key_value_heads, d)
    v = F.linear(a, w["self_attn.v_proj.weight"]).view(n, cfg.num_key_value_heads, d)
    cos, sin = rope_cos_sin(positions, d, cfg.rope_theta)
    attn = causal_gqa_attention(apply_rope(q, cos, sin), apply_rope(k, cos, sin), v)  # [n, heads, d]
    h = x + F.linear(attn.reshape(n, -1), w["self_attn.o_proj.weight"])
    m = rms_norm(h, w["post_attention_layernorm.weight"], cfg.rms_norm_eps)
    return h + swiglu(m, w["mlp.gate_proj.weight"], w["mlp.up_proj.weight"], w["mlp.down_proj.weight"])
    ### END SOLUTION


# %% [markdown]
# <details><summary>Hint 1: a nudge</summary>
#
# Walk the diagram left to right and write the shape of every tensor, as in the worked example,
# before you write the line that makes it.
#
# </details>
# <details><summary>Hint 2: the idea</summary>
#
# Attention half: norm, three projections, split the last dim into heads, the same RoPE tables on q and
# k (not v), attention, flatten the heads, `o_proj`, add to the block's input `x` (not to the normed
# one). MLP half: norm of that sum, SwiGLU, add to that sum.
#
# </details>
# <details><summary>Hint 3: the formula</summary>
#
# `a = norm₁(x)`; `q, k, v` = the projections of `a`, split into heads; `h = x + o_proj(flatten(attention(rope(q),
# rope(k), v)))`; `out = h + swiglu(norm₂(h))`.
#
# </details>

# %%
check("1.6")

# %% [markdown]
# ## Exercise 1.7 · The whole model (~8 min)
#
# A checkpoint is a flat dictionary of named tensors. The ones you need:
#
# | name | shape |
# | --- | --- |
# | `model.embed_tokens.weight` | `[vocab, hidden]`: row `t` is token `t`'s vector |
# | `model.layers.{i}.<the names of 1.6>` | per layer, `i = 0 .. num_hidden_layers - 1` |
# | `model.norm.weight` | `[hidden]`, a last RMSNorm after the layers |
# | `lm_head.weight` | `[vocab, hidden]`, absent when `cfg.tie_word_embeddings`: then the embedding matrix is reused |
#
# The forward has three parts: in (ids to vectors), the layers, out (vectors to one score per
# vocabulary entry, by a product with the LM head). The positions of a whole sequence start at 0.

# %% exercise="1.7"
def transformer_forward(token_ids: Tensor, weights: dict[str, Tensor], cfg: ModelConfig) -> Tensor:
    """The full forward pass of a Llama-family decoder over one whole sequence, no cache.

    token_ids: [n] int64, each below cfg.vocab_size; weights: a checkpoint's tensors by name (the table
    above), lm_head.weight absent when cfg.tie_word_embeddings; cfg: the model's config.
    -> logits [n, vocab] float32, one row of scores per position (row t scores the token after t).
    Uses your decoder_block on every layer in order; weights are not modified.
    """
    ### BEGIN SOLUTION
    x = weights["model.embed_tokens.weight"][token_ids]  # [n, hidden]
    positions = torch.arange(token_ids.shape[0])
    for i in range(cfg.num_hidden_layers):
        prefix = f"model.layers.{i}."
        layer = {name[len(prefix):]: t for name, t in weights.items() if name.startswith(prefix)}
        x = decoder_block(x, positions, layer, cfg)
    x = rms_norm(x, weights["model.norm.weight"], cfg.rms_norm_eps)
    return F.linear(x, weights.get("lm_head.weight", weights["model.embed_tokens.weight"]))  # [n, vocab]
    ### END SOLUTION


# %% [markdown]
# <details><summary>Hint 1: a nudge</summary>
#
# Which tensor turns ids into vectors, and how do you read one row of it per token at once?
#
# </details>
# <details><summary>Hint 2: the idea</summary>
#
# Index the embedding matrix by the ids; for each layer, gather its tensors with the prefix stripped
# and run your block at positions `0 .. n-1`; then the final norm (with the config's eps) and the
# product with the LM head, which is the embedding matrix when the checkpoint has none.
#
# </details>
# <details><summary>Hint 3: the formula</summary>
#
# `x = E[token_ids]`; for every layer `i`: `x = block_i(x, 0..n-1)`; `logits = norm(x) Hᵀ`, with
# `H = lm_head.weight`, or `E` when tied.
#
# </details>

# %%
check("1.7")

# %% [markdown]
# ## Your model, the bundled weights (~5 min)
#
# Load the bundled checkpoint into plain tensors, run your forward pass, and compare with
# `minillm`. Then let your own code write a few tokens, greedily, by recomputing the whole
# sequence for every new token (lab 02 removes that waste).

# %%
llm = LLM(MODEL)
model_dir = llm.engine.model_dir
cfg = ModelConfig.from_file(model_dir / "config.json")
weights = load_file(model_dir / "model.safetensors")
print(f"{cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, {cfg.num_attention_heads} heads on "
      f"{cfg.num_key_value_heads} kv heads, vocab {cfg.vocab_size}, "
      f"{sum(t.numel() for t in weights.values()):,} parameters")

prompt = "def fibonacci(n):"
ids = torch.tensor(llm.tokenizer.encode(prompt))
with torch.no_grad():
    mine, theirs = transformer_forward(ids, weights, cfg), llm.logits(ids)
print(f"max |your logits - minillm's| = {(mine - theirs).abs().max():.2e}")

generated = ids.tolist()
with torch.no_grad():
    for _ in range(24):
        generated.append(int(transformer_forward(torch.tensor(generated), weights, cfg)[-1].argmax()))
print(repr(llm.tokenizer.decode(generated)))

# %% [markdown]
# ## Measure it: where does a forward pass spend its time? (~8 min)
#
# Time your forward pass and `minillm`'s at growing prompt lengths, then split one layer of yours
# into its parts. Before you run the two cells, guess: as the prompt grows, does the cost per token
# stay flat or grow, and which part of a layer grows fastest? (Count, for each part, how its work
# scales with the number of tokens.)

# %%
from minillm.perf import measure_flops, median_time  # median of `repeats` timed runs after one warm-up

cpu_flops = measure_flops(torch.device("cpu"), torch.float32)  # lab 00's compute ceiling, this machine, now
lm_head = cfg.vocab_size * cfg.hidden_size  # tied or not, every token meets an LM head
multiplied = sum(t.numel() for name, t in weights.items() if "embed_tokens" not in name) + lm_head
lengths = [16, 64, 256]
yours, engine, floor = [], [], []
with torch.no_grad():
    for n in lengths:
        x_ids = torch.randint(1, cfg.vocab_size, (n,))
        yours.append(median_time(lambda: transformer_forward(x_ids, weights, cfg), 3) / n * 1e3)
        engine.append(median_time(lambda: llm.logits(x_ids), 3) / n * 1e3)
        attention = cfg.num_hidden_layers * 4 * n * n * cfg.num_attention_heads * cfg.head_dim  # lab 00's count
        floor.append((2 * multiplied * n + attention) / cpu_flops / n * 1e3)
fig = go.Figure([go.Scatter(x=lengths, y=yours, name="your transformer_forward", mode="lines+markers"),
                 go.Scatter(x=lengths, y=engine, name="minillm (fused qkv, SDPA)", mode="lines+markers"),
                 go.Scatter(x=lengths, y=floor, name="compute floor (lab 00: FLOPs / FLOP/s)", mode="lines",
                            line_dash="dot")])
fig.update_layout(title="Forward pass cost per prompt token", xaxis_title="prompt length (tokens)",
                  yaxis_title="ms per token", height=360)
fig.show()

# %%
n = 256
layer0 = {k[len("model.layers.0."):]: t for k, t in weights.items() if k.startswith("model.layers.0.")}
x = torch.randn(n, cfg.hidden_size)
q, k, v = (torch.randn(n, cfg.num_attention_heads, cfg.head_dim), torch.randn(n, cfg.num_key_value_heads, cfg.head_dim),
           torch.randn(n, cfg.num_key_value_heads, cfg.head_dim))
cos, sin = rope_cos_sin(torch.arange(n), cfg.head_dim, cfg.rope_theta)
parts = {
    "rms_norm": lambda: rms_norm(x, layer0["input_layernorm.weight"], cfg.rms_norm_eps),
    "q, k, v, o projections": lambda: [F.linear(x, layer0[f"self_attn.{p}_proj.weight"]) for p in "qkvo"],
    "RoPE": lambda: (apply_rope(q, cos, sin), apply_rope(k, cos, sin)),
    "attention (scores, softmax, mix)": lambda: causal_gqa_attention(q, k, v),
    "SwiGLU MLP": lambda: swiglu(x, layer0["mlp.gate_proj.weight"], layer0["mlp.up_proj.weight"],
                                 layer0["mlp.down_proj.weight"]),
}
with torch.no_grad():
    ms = {name: median_time(fn, 3) * 1e3 for name, fn in parts.items()}
fig = go.Figure(go.Bar(x=list(ms.values()), y=list(ms), orientation="h"))
fig.update_layout(title=f"One layer of yours at {n} tokens", xaxis_title="ms", height=300)
fig.show()
print(f"per token, your forward took {yours[0]:.2f} ms at {lengths[0]} tokens and {yours[-1]:.2f} ms at "
      f"{lengths[-1]} ({yours[0] / floor[0]:.0f}x and {yours[-1] / floor[-1]:.0f}x the compute floor, at "
      f"{cpu_flops / 1e9:.1f} GFLOP/s); at {n} tokens the largest part of a layer was {max(ms, key=ms.get)}")

# %% [markdown]
# The projections and the MLP do a fixed amount of work per token (each token meets every weight once);
# attention's work per token grows with the length, because each query looks at every earlier key.
# Which of the two dominates at each length, on this model, is what your plot shows; the dotted line is
# what lab 00's compute ceiling allows. Where a short prompt sits far above it, look to the few hundred
# small operator calls of a forward: they cost about the same at 16 tokens as at 256, so per token they
# weigh most on the shortest prompt.

# %% [markdown]
# ## Predict, then measure: your decoder on SmolLM2 (~20 min)
#
# `tiny` was trained for this course. Your code should run any Llama-family checkpoint unchanged,
# so give it a real one, all 30 of its layers: SmolLM2-135M-Instruct, a chat model with hidden size 576,
# 9 query heads sharing 3 kv heads (a GQA group of 3), head dim 64, a 49,152-token vocabulary and
# tied embeddings (no `lm_head.weight` in the file). `minillm` converts it from the GGUF file its
# package ships to a Hugging Face folder (once, into a cache), which you read exactly as you read
# `tiny`'s. Only `cfg` changes, and your functions take every size from it.
#
# The prompt is a chat turn, written in the model's chat template. The next cell loads the weights,
# tokenizes the prompt and measures this machine's ceilings on one thread (lab 00's
# `measure_flops` and `measure_bandwidth`): torch runs on one thread here, which on a shared machine
# is faster for operators this small. If the model is not installed, the cell says how to install it
# and the section is skipped.

# %%
from minillm.labkit import REAL_MODEL, compare, real_model_installed
from minillm.perf import measure_bandwidth, measure_flops

have_real = real_model_installed()
if have_real:
    torch.set_num_threads(1)  # on a shared CPU, a second thread mostly waits for a core in small operators
    real = LLM(REAL_MODEL)
    real_cfg = ModelConfig.from_file(real.engine.model_dir / "config.json")
    real_weights = load_file(real.engine.model_dir / "model.safetensors")
    chat = real.chat_template.render([{"role": "user", "content": "What is the capital of France?"}])
    chat_ids = torch.tensor(real.tokenizer.encode(chat))
    one_flops = measure_flops(torch.device("cpu"), torch.float32)
    one_bandwidth = measure_bandwidth(torch.device("cpu"))
    print(f"{real_cfg.num_hidden_layers} layers, hidden {real_cfg.hidden_size}, intermediate "
          f"{real_cfg.intermediate_size}, {real_cfg.num_attention_heads} heads on {real_cfg.num_key_value_heads} kv "
          f"heads of {real_cfg.head_dim}, vocab {real_cfg.vocab_size}, tied embeddings: "
          f"{'lm_head.weight' not in real_weights}, {sum(t.numel() for t in real_weights.values()):,} parameters")
    print(f"the prompt: {len(chat_ids)} tokens. This machine, one thread: {one_flops / 1e9:.1f} GFLOP/s, "
          f"{one_bandwidth / 1e9:.1f} GB/s")

# %% [markdown]
# **Your prediction.** How long will your `transformer_forward` take over this prompt, all 30 layers?
# Work it out with lab 00's model before the next cell times it. Each token meets every weight a token
# is multiplied by once (a multiply-add, 2 FLOPs), and the embedding table is only looked up, except
# that here it is also the LM head; at a few dozen tokens attention adds little. The weights are read
# from memory once for the whole prompt. Is this forward compute-bound or memory-bound on this machine
# (compare its intensity with the ridge, FLOP/s over bandwidth)? That gives a floor, in ms. Then decide
# how far above the floor your plain, unfused code will run, and write the number down.

# %%
MY_PREDICTION = None  # ms: your transformer_forward over the chat prompt on SmolLM2, one thread, from lab 00

# %% [markdown]
# The cell below runs your forward over the prompt and compares its logits with the engine's
# (`real.logits(token_ids)`, the same numbers the engine samples from). Over the whole prompt they
# should agree to float32 rounding: after 30 layers, differences far below the logits' own size, and the
# same top token at every position. Then it times yours and the engine's, and sets your prediction beside
# the roofline floor.

# %%
if have_real:
    repeats = 2 if quick_run() else 5
    with torch.no_grad():
        mine, theirs = transformer_forward(chat_ids, real_weights, real_cfg), real.logits(chat_ids)
        mine_ms = median_time(lambda: transformer_forward(chat_ids, real_weights, real_cfg), repeats) * 1e3
        engine_ms = median_time(lambda: real.logits(chat_ids), repeats) * 1e3
    gap = (mine - theirs).abs().max().item()
    same_top = bool((mine.argmax(-1) == theirs.argmax(-1)).all())
    print(f"max |your logits - minillm's| = {gap:.2e} over {len(chat_ids)} positions (logits up to "
          f"{theirs.abs().max():.1f}); same top token at every position: {same_top}")
    print("✔ your decoder runs SmolLM2 as the engine does" if gap <= 1e-3 and same_top else
          "❌ your logits differ from the engine's by more than float32 rounding: the shapes and names work, "
          "so look for a constant or a convention (eps, theta, tied embeddings, the head mapping)")
    n_tokens, hidden, vocab = len(chat_ids), real_cfg.hidden_size, real_cfg.vocab_size
    multiplied = sum(t.numel() for name, t in real_weights.items() if "embed_tokens" not in name) + vocab * hidden
    attention = real_cfg.num_hidden_layers * 4 * n_tokens ** 2 * real_cfg.num_attention_heads * real_cfg.head_dim
    flops, nbytes = 2 * multiplied * n_tokens + attention, multiplied * 4
    floor_ms = max(flops / one_flops, nbytes / one_bandwidth) * 1e3
    print(f"lab 00's count: {flops / 1e9:.1f} GFLOP and {nbytes / 1e6:.0f} MB of weights, intensity "
          f"{flops / nbytes:.0f} FLOP/byte against a ridge of {one_flops / one_bandwidth:.1f}: "
          f"{'compute' if flops / one_flops > nbytes / one_bandwidth else 'memory'}-bound; "
          f"the engine's forward took {engine_ms:.0f} ms")
    compare(f"your transformer_forward over {n_tokens} tokens of SmolLM2", MY_PREDICTION, theory=floor_ms,
            measured=mine_ms, unit="ms", theory_name="roofline floor (lab 00)",
            gap=f"your forward takes {mine_ms / floor_ms:.1f}x the floor and the engine {engine_ms / floor_ms:.1f}x; "
                "what separates the two is unfused work (three q, k, v products and two gate, up products where "
                "the engine does one each, attention built by hand) and Python between hundreds of small calls"
                + ("; an engine at or under the floor runs its large fused matmuls faster than the 1024 x 1024 one "
                   "that measured the ceiling." if engine_ms <= floor_ms else "."))

# %% [markdown]
# Now what your decoder says. The first table shows the probability of the five likeliest next tokens
# after the prompt, under your logits and the engine's; then your forward answers the question by
# itself, greedily (every token recomputes the whole sequence, so this takes a little while).

# %%
if have_real:
    print("the next token after the prompt   yours    minillm's")
    mine_p, theirs_p = mine[-1].softmax(-1), theirs[-1].softmax(-1)
    for token in theirs_p.topk(5).indices.tolist():
        print(f"{real.tokenizer.decode([token])!r:>30}   {mine_p[token]:.4f}   {theirs_p[token]:.4f}")
    answer = chat_ids.tolist()
    with torch.no_grad():
        for _ in range(4 if quick_run() else 12):
            answer.append(int(transformer_forward(torch.tensor(answer), real_weights, real_cfg)[-1].argmax()))
            if answer[-1] in real_cfg.eos_token_ids:
                break
    print("\nyour forward answers:", repr(real.tokenizer.decode(answer[len(chat_ids):])))
    del real, real_weights

# %% [markdown]
# The same seven functions ran a model many times the size of `tiny` (compare the two parameter counts
# printed above), with a different number of heads, another GQA group and tied embeddings, and, if your
# check line shows ✔, agreed with the engine to rounding. That is what "Llama-family" means in practice:
# one program, and a config that fills in the sizes. If your time was far from your prediction, find
# which step of the reasoning was off: the FLOPs, the bound, or how far above the floor plain code runs.

# %% [markdown]
# ## How production engines do it (~5 min)
#
# * **Fused projections.** `minillm`, like vLLM (`QKVParallelLinear`, `MergedColumnParallelLinear`),
#   stacks `q/k/v` into one matrix and `gate/up` into another when it loads a checkpoint: one
#   large matmul instead of three small ones. Look at `minillm/models/loader.py`.
# * **Fused kernels.** vLLM, SGLang and TensorRT-LLM run RMSNorm together with the residual add,
#   and RoPE in place on q and k, as single GPU kernels; each unfused op would read and write the
#   whole activation again. Lab 07 writes such kernels in Triton.
# * **Attention kernels.** Nobody materialises the `[heads, q_len, kv_len]` score matrix you just
#   built: FlashAttention and FlashInfer (used by vLLM and SGLang) compute the softmax block by
#   block in on-chip memory. `minillm` calls PyTorch's `scaled_dot_product_attention`, which does
#   the same on GPUs.
# * **The offset mask** you wrote in 1.4 is exactly what every engine needs once a KV cache holds
#   the earlier tokens: lab 02 builds that cache.
