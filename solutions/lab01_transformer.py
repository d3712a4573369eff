# %% [markdown]
# # Lab 01 · A transformer from scratch
#
# **Time:** about 90 minutes. **You need:** Python, a little PyTorch (`matmul`, `softmax`, broadcasting).
#
# A language model's forward pass is a short program: look up one vector per token, push the
# vectors through a stack of identical *decoder blocks*, and turn the last vectors into scores over
# the vocabulary. In this lab you write that program yourself, piece by piece, load the weights of
# the course's bundled model into it, and check that your logits match `minillm`'s up to float
# rounding.
#
# ## Learning objectives
# By the end you can
# 1. write RMSNorm, rotary position embeddings (RoPE), causal grouped-query attention and the SwiGLU
#    MLP as plain tensor code;
# 2. explain why the causal mask must be *offset* when the queries are only the last few positions
#    (the situation a KV cache creates);
# 3. map query heads to key/value heads in grouped-query attention, and say what GQA saves;
# 4. read a Hugging Face checkpoint (`config.json` + `model.safetensors`) and run it with your own code;
# 5. measure where a forward pass spends its time.
#
# ## How this lab works
# Write code only in the **exercise cells** (they contain `raise NotImplementedError`). Keep the
# function names and signatures: the grader calls them. Run the `check(...)` cell after each
# exercise for instant feedback; `make grade LAB=01` grades the whole notebook. Shapes are written
# `[q_len, heads, head_dim]`; every tensor here is float32 on the CPU.

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

MODEL = "tiny"  # the bundled model: a 6-layer Llama-style decoder trained on Python code
torch.manual_seed(0)

# %% [markdown]
# ## The concept: one decoder block
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
# *last* `q_len` of `kv_len` positions, and the mask's diagonal moves right by `kv_len - q_len`.
# Here is the mask for 3 new queries over 7 positions:

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
# ## Exercise 1.1 · RMSNorm
#
# RMSNorm rescales each vector to unit root-mean-square, then multiplies by a learned gain:
#
# $$y = \frac{x}{\sqrt{\operatorname{mean}(x^2) + \varepsilon}} \odot w$$
#
# The mean is over the last (hidden) dimension only, so every token is normalised on its own.
# Unlike LayerNorm there is no mean subtraction and no bias.

# %% exercise="1.1"
def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """Normalise each vector by its root-mean-square, then scale by `weight`.

    x: [..., hidden]; weight: [hidden] -> [..., hidden]
    y = x / sqrt(mean(x**2 over the last dim) + eps) * weight

    Hints: 2 lines. `x.pow(2).mean(-1, keepdim=True)`, `torch.rsqrt`.
    """
    ### BEGIN SOLUTION
    inv_rms = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)  # [..., 1]
    return x * inv_rms * weight
    ### END SOLUTION


# %%
check("1.1")

# %% [markdown]
# ## Exercise 1.2 · The rotary tables
#
# RoPE encodes a token's position by *rotating* pairs of dimensions of q and k. Pair `i` (of
# `head_dim / 2`) turns by the angle `position * inv_freq[i]` with
#
# $$\text{inv\_freq}_i = \theta^{-2i/\text{head\_dim}}, \quad i = 0, \dots, \tfrac{\text{head\_dim}}{2} - 1$$
#
# Low `i` spin fast (fine position), high `i` slowly (coarse position). Hugging Face's layout, which
# every checkpoint you will load follows, pairs dimension `i` with dimension `i + head_dim/2`
# ("rotate-half"), so the tables hold each angle twice: `[angles, angles]` along the last axis.

# %% exercise="1.2"
def rope_cos_sin(positions: Tensor, head_dim: int, theta: float) -> tuple[Tensor, Tensor]:
    """Cosine and sine tables of the rotary angles at the given positions.

    positions: [n] (integers, any order) -> (cos, sin), each [n, head_dim]
    angle[p, i] = positions[p] * theta ** (-2i / head_dim) for i < head_dim / 2;
    each table is [angle, angle] concatenated on the last dim.

    Hints: 4 lines. `torch.arange(0, head_dim, 2)`, `torch.outer`, `torch.cat`.
    """
    ### BEGIN SOLUTION
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)  # [head_dim / 2]
    angles = torch.outer(positions.float(), inv_freq)  # [n, head_dim / 2]
    angles = torch.cat([angles, angles], dim=-1)  # [n, head_dim]
    return angles.cos(), angles.sin()
    ### END SOLUTION


# %%
check("1.2")

# %% [markdown]
# ## Exercise 1.3 · Applying RoPE
#
# Split each head vector into halves `x1 = x[..., :d/2]`, `x2 = x[..., d/2:]`. Then
#
# $$\text{out} = x \odot \cos + \operatorname{rotate\_half}(x) \odot \sin, \qquad
# \operatorname{rotate\_half}([x_1, x_2]) = [-x_2, x_1]$$
#
# Because both q and k are rotated, the score `q·k` depends only on the *distance* between their
# positions. That is why a cached key never needs rotating again. (The RoPE paper pairs adjacent
# dimensions `2i, 2i+1`; Hugging Face checkpoints permute their weights so that rotate-half is right
# for them. Mixing the two conventions is a classic silent bug.)

# %% exercise="1.3"
def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate every head vector of every token by its position's angles (rotate-half layout).

    x: [n, heads, head_dim]; cos, sin: [n, head_dim] -> [n, heads, head_dim]
    out = x * cos + rotate_half(x) * sin, with rotate_half([x1, x2]) = [-x2, x1]

    Hints: 3 lines. `x.chunk(2, dim=-1)`, `torch.cat`, `cos[:, None, :]` to broadcast over heads.
    """
    ### BEGIN SOLUTION
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)  # [n, heads, head_dim]
    return x * cos[:, None, :] + rotated * sin[:, None, :]
    ### END SOLUTION


# %%
check("1.3")

# %% [markdown]
# ## Exercise 1.4 · Causal grouped-query attention
#
# $$\operatorname{Attention}(q, k, v) = \operatorname{softmax}\!\left(\frac{q k^\top}{\sqrt{d}} + M\right) v$$
#
# with `M = -inf` where the query may not look. Two details make this the engine's version rather
# than the textbook's:
#
# * **The queries are the last positions.** `q` holds `q_len` queries and `k`, `v` hold `kv_len >= q_len`
#   positions; query `i` sits at position `kv_len - q_len + i` and sees keys `0 ..` that position.
#   With `q_len == kv_len` this is the familiar lower triangle.
# * **Grouped-query attention (GQA).** There are fewer key/value heads than query heads. With
#   `group = heads // kv_heads`, query head `h` reads kv head `h // group`: query heads `0 .. group-1`
#   share kv head 0, and so on. The KV cache shrinks by the factor `group`.

# %% exercise="1.4"
def causal_gqa_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Causal grouped-query attention of the last q_len positions over all kv_len positions.

    q: [q_len, heads, head_dim]; k, v: [kv_len, kv_heads, head_dim], kv_len >= q_len
    -> [q_len, heads, head_dim]
    Query i is at position kv_len - q_len + i and may attend to keys 0 .. kv_len - q_len + i.
    Query head h uses kv head h // (heads // kv_heads).
    out = softmax(q k^T / sqrt(head_dim) + mask) v

    Hints: about 8 lines. `repeat_interleave(group, dim=1)`, `torch.einsum` (or `transpose` + `@`),
    `torch.arange` to build the mask, `masked_fill(~allowed, float("-inf"))`, `softmax(-1)`.
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


# %%
check("1.4")

# %% [markdown]
# ## Exercise 1.5 · The SwiGLU MLP
#
# $$\operatorname{MLP}(x) = W_\text{down}\big(\operatorname{silu}(W_\text{gate}\,x) \odot W_\text{up}\,x\big), \qquad
# \operatorname{silu}(z) = z\,\sigma(z)$$
#
# Weights are stored as PyTorch's `nn.Linear` stores them, `[out_features, in_features]`, so
# "apply `W`" is `x @ W.T` (or `F.linear(x, W)`).

# %% exercise="1.5"
def swiglu(x: Tensor, w_gate: Tensor, w_up: Tensor, w_down: Tensor) -> Tensor:
    """The gated feed-forward block of Llama-family models.

    x: [n, hidden]; w_gate, w_up: [intermediate, hidden]; w_down: [hidden, intermediate] -> [n, hidden]
    out = (silu(x @ w_gate.T) * (x @ w_up.T)) @ w_down.T

    Hints: 1 or 2 lines. `F.linear`, `F.silu`.
    """
    ### BEGIN SOLUTION
    return F.linear(F.silu(F.linear(x, w_gate)) * F.linear(x, w_up), w_down)
    ### END SOLUTION


# %%
check("1.5")

# %% [markdown]
# ## Exercise 1.6 · A decoder block
#
# Put the pieces together. `w` holds one layer's tensors under their Hugging Face names (without
# the `model.layers.{i}.` prefix). Take every size from `cfg`: `cfg.num_attention_heads`,
# `cfg.num_key_value_heads`, `cfg.head_dim` (which need not equal `hidden_size / heads`),
# `cfg.rms_norm_eps`, `cfg.rope_theta`. The tokens are one whole sequence, token `i` at absolute
# position `positions[i]`: increasing, but not necessarily `0 .. n-1` (RoPE rotates by these positions;
# the causal mask is over the tokens in the order given).

# %% exercise="1.6"
def decoder_block(x: Tensor, positions: Tensor, w: dict[str, Tensor], cfg: ModelConfig) -> Tensor:
    """One pre-norm decoder layer over one sequence.

    x: [n, hidden]; positions: [n] (increasing, may start above 0 and have gaps) -> [n, hidden]
    a = rms_norm(x); q, k, v = a @ Wq.T, a @ Wk.T, a @ Wv.T  (split into heads)
    h = x + (causal_gqa_attention(rope(q), rope(k), v) flattened) @ Wo.T
    out = h + swiglu(rms_norm(h))
    Weight names: input_layernorm.weight, self_attn.{q,k,v,o}_proj.weight,
    post_attention_layernorm.weight, mlp.{gate,up,down}_proj.weight.

    Hints: about 10 lines, using your functions from 1.1-1.5. `.view(n, heads, head_dim)`.
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


# %%
check("1.6")

# %% [markdown]
# ## Exercise 1.7 · The whole model
#
# A checkpoint is a flat dictionary of named tensors. The ones you need:
#
# | name | shape |
# | --- | --- |
# | `model.embed_tokens.weight` | `[vocab, hidden]` |
# | `model.layers.{i}.<the names of 1.6>` | per layer, `i = 0 .. num_hidden_layers - 1` |
# | `model.norm.weight` | `[hidden]` |
# | `lm_head.weight` | `[vocab, hidden]`, absent when `cfg.tie_word_embeddings`: then the embedding matrix is reused |

# %% exercise="1.7"
def transformer_forward(token_ids: Tensor, weights: dict[str, Tensor], cfg: ModelConfig) -> Tensor:
    """The full forward pass of a Llama-family decoder over one sequence, no cache.

    token_ids: [n] -> logits [n, vocab]
    x = embed[token_ids]; x = decoder_block(x, 0..n-1, layer i) for each layer;
    logits = rms_norm(x, model.norm.weight) @ lm_head.T   (lm_head = embed when tied)

    Hints: about 8 lines. A dict comprehension strips the `model.layers.{i}.` prefix;
    `weights.get("lm_head.weight", ...)`.
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


# %%
check("1.7")

# %% [markdown]
# ## Your model, the real weights
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
# ## Measure it: where does a forward pass spend its time?
#
# Time your forward pass and `minillm`'s at growing prompt lengths, then split one layer of yours
# into its parts. Per-token cost stays nearly flat while the matmuls with the weights dominate;
# attention's share grows with length, because each query looks at every earlier key.

# %%
from minillm.perf import median_time  # median of `repeats` timed runs after one warm-up


lengths = [16, 64, 256]
yours, engine = [], []
with torch.no_grad():
    for n in lengths:
        x_ids = torch.randint(1, cfg.vocab_size, (n,))
        yours.append(median_time(lambda: transformer_forward(x_ids, weights, cfg), 3) / n * 1e3)
        engine.append(median_time(lambda: llm.logits(x_ids), 3) / n * 1e3)
fig = go.Figure([go.Scatter(x=lengths, y=yours, name="your transformer_forward", mode="lines+markers"),
                 go.Scatter(x=lengths, y=engine, name="minillm (fused qkv, SDPA)", mode="lines+markers")])
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

# %% [markdown]
# ## On a real model
#
# `tiny` was trained for this course. Your code should run any Llama-family checkpoint unchanged,
# so give it a real one: SmolLM2-135M-Instruct, a chat model with 30 layers, hidden size 576,
# 9 query heads sharing 3 kv heads (a GQA group of 3), head dim 64, a 49,152-token vocabulary and
# tied embeddings (no `lm_head.weight` in the file). `minillm` converts it from the GGUF file its
# package ships to a Hugging Face folder (once, into a cache), which you read exactly as you read
# `tiny`'s. Only `cfg` changes, and your functions take every size from it.
#
# The prompt is a chat turn, written in the model's chat template. Over the whole prompt your
# logits should equal `minillm`'s to float32 rounding: after 30 layers, differences of about 1e-4
# on logits of size tens. The cell checks them against a tolerance of 1e-3, and checks that both
# pick the same top token at every position. Then your forward answers the question by itself,
# greedily (every token recomputes the whole sequence, so this takes a little while). The cell
# runs torch on one thread, which on a shared machine is faster for operators this small. If the
# model is not installed, the cell says how to install it and skips.

# %%
from minillm.labkit import REAL_MODEL, real_model_installed

if real_model_installed():
    torch.set_num_threads(1)  # on a shared CPU, a second thread mostly waits for a core in small operators
    real = LLM(REAL_MODEL)
    real_cfg = ModelConfig.from_file(real.engine.model_dir / "config.json")
    real_weights = load_file(real.engine.model_dir / "model.safetensors")
    print(f"{real_cfg.num_hidden_layers} layers, hidden {real_cfg.hidden_size}, {real_cfg.num_attention_heads} "
          f"heads on {real_cfg.num_key_value_heads} kv heads, vocab {real_cfg.vocab_size}, tied embeddings: "
          f"{'lm_head.weight' not in real_weights}, {sum(t.numel() for t in real_weights.values()):,} parameters")
    chat = real.chat_template.render([{"role": "user", "content": "What is the capital of France?"}])
    chat_ids = torch.tensor(real.tokenizer.encode(chat))
    with torch.no_grad():
        mine, theirs = transformer_forward(chat_ids, real_weights, real_cfg), real.logits(chat_ids)
    gap = (mine - theirs).abs().max().item()
    print(f"{len(chat_ids)} prompt tokens; max |your logits - minillm's| = {gap:.2e} (logits up to "
          f"{theirs.abs().max():.1f}); within 1e-3: {gap <= 1e-3}; same top token at every position: "
          f"{bool((mine.argmax(-1) == theirs.argmax(-1)).all())}")
    print("\nthe next token after the prompt   yours    minillm's")
    mine_p, theirs_p = mine[-1].softmax(-1), theirs[-1].softmax(-1)
    for token in theirs_p.topk(5).indices.tolist():
        print(f"{real.tokenizer.decode([token])!r:>30}   {mine_p[token]:.4f}   {theirs_p[token]:.4f}")
    answer = chat_ids.tolist()
    with torch.no_grad():
        for _ in range(12):
            answer.append(int(transformer_forward(torch.tensor(answer), real_weights, real_cfg)[-1].argmax()))
            if answer[-1] in real_cfg.eos_token_ids:
                break
    print("\nyour forward answers:", repr(real.tokenizer.decode(answer[len(chat_ids):])))
    del real, real_weights

# %% [markdown]
# The same six functions ran a model 23 times the size of `tiny`, with a different number of
# heads, another GQA group and tied embeddings, and agreed with the engine to rounding. That is
# what "Llama-family" means in practice: one program, and a config that fills in the sizes.

# %% [markdown]
# ## How production engines do it
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
