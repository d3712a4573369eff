# %% [markdown]
# # Lab 00 · The roofline and the memory wall
#
# **Time:** about 80 minutes in all (each section's heading gives its share). **You need:** Python; no
# PyTorch beyond creating tensors.
#
# Before optimising an inference engine, know what limits it. A processor can do two things fast:
# arithmetic (FLOP/s) and moving bytes from memory (bytes/s). Every kernel needs some of each, and
# whichever takes longer sets its time. This lab builds the *roofline model* from that one idea,
# measures this machine, and uses the model to predict how fast a language model can decode, and
# why generating text one token at a time is limited by memory bandwidth, not by arithmetic.
#
# **See it live:** the visualizer's **Roofline** page (`make app`, under "Models of performance") places
# prefill and decode of any model on this machine's measured roofline or a GPU's.
# **Read more:** [docs/benchmarks/index.md](../docs/benchmarks/index.md), where the engine's decode on the
# real model is recorded beside a bare loop and llama.cpp, each record with its machine.
#
# ## Learning objectives
# By the end you can
# 1. count the FLOPs and bytes of a matmul, a matrix-vector product and attention, and compute their
#    **arithmetic intensity**;
# 2. predict a kernel's time from the two ceilings of the roofline;
# 3. count the bytes a decode step must move (weights + KV cache) and predict decode tokens/s for any
#    model on any hardware;
# 4. explain why decode is memory-bound and prefill compute-bound, and why batching helps decode;
# 5. predict SmolLM2-135M's decode speed on this machine, then compare with what `minillm` measures.
#
# ## How this lab works
# Write code only in the exercise cells (they contain `raise NotImplementedError`), keeping names
# and signatures. Each exercise's docstring is its contract (what goes in, what comes out, in which
# units); the section above it builds the idea on other numbers, and the collapsed hints below it go
# from a nudge to the formula: open them only when you are stuck. Run each `check(...)` cell for
# feedback; `make grade LAB=00` grades the notebook. Units: FLOPs, bytes, seconds; a multiply-add
# counts as 2 FLOPs (one multiply, one add).

# %% tags=["setup"]
from minillm.labkit import check
from minillm.models.model_config import ModelConfig

# %%
import plotly.graph_objects as go
import torch

from minillm import LLM, SamplingParams
from minillm.labkit import quick_run
from minillm.models.llama import LlamaForCausalLM

MODEL = "tiny"  # the bundled model: a 6-layer Llama-style decoder trained on Python code

# %% [markdown]
# ## The concept: two ceilings (~5 min)
#
# **Arithmetic intensity** `I = FLOPs / bytes moved` is a property of the work. A machine with peak
# compute `P` (FLOP/s) and memory bandwidth `B` (bytes/s) can sustain at most `min(P, I × B)` FLOP/s:
# below the *ridge point* `I = P / B` the memory ceiling binds, above it the compute ceiling. On a
# log-log plot that is a slanted roof meeting a flat one, hence the name. NVIDIA's datasheet for the
# H100 SXM gives 989 TFLOP/s of dense bf16 and 3.35 TB/s of HBM3, a ridge near 300 FLOP/byte: work
# that does fewer than ~300 FLOPs per byte it touches leaves the tensor cores idle.

# %%
import math

intensity = [2 ** e for e in range(-2, 13)]
peak, bandwidth = 989e12, 3.35e12  # H100 SXM (NVIDIA's datasheet): dense bf16 tensor-core FLOP/s, HBM3 bytes/s
ridge = peak / bandwidth
fig = go.Figure(go.Scatter(x=intensity, y=[min(peak, i * bandwidth) / 1e12 for i in intensity], name="H100 roofline"))
# On a log axis plotly places a line (a shape) at the value itself but its label (an annotation) at log10 of it.
fig.add_vline(x=ridge, line_dash="dot", annotation_text=f"ridge ≈ {ridge:.0f} FLOP/B", annotation_x=math.log10(ridge),
              annotation_position="bottom right")
fig.update_layout(title="The roofline of an H100", xaxis_type="log", yaxis_type="log", height=360,
                  xaxis_title="arithmetic intensity (FLOP / byte)", yaxis_title="attainable TFLOP/s")
fig.show()

# %% [markdown]
# ## Exercise 0.1 · The cost of a matmul (~8 min)
#
# Count the work of a small product by hand first. Take `A: [2, 3]` and `B: [3, 4]`, so `C = A @ B` is
# `[2, 4]`. Each of C's 8 entries is a dot product of a row of A with a column of B: 3 products,
# summed, so 3 multiply-adds, 6 FLOPs. The whole product: 8 × 6 = 48 FLOPs.
#
# Now the memory. The *least* a kernel can move is every input read once and the output written
# once: a kernel that re-reads moves more, never less. In float16 (2 bytes) A is 6 numbers, B 12,
# C 8: 26 numbers, 52 bytes. Its intensity, 48 / 52 ≈ 0.9 FLOP/byte, is tiny: each number fetched is
# used about once.
#
# Your function does the same count for any `[m, k] @ [k, n]` and any element width. Then the cell
# below it prints the intensity as `m` grows. `m = 1` is a matrix-vector product: the shape of a
# decode step, where one token meets every weight matrix. Before you run it, guess: what happens to
# the intensity as `m` goes from 1 to 4096?

# %% exercise="0.1"
def matmul_cost(m: int, k: int, n: int, bytes_per_element: int) -> tuple[float, float]:
    """FLOPs and the minimum bytes moved by the product of an [m, k] matrix and a [k, n] matrix.

    m, k, n: sizes >= 1; bytes_per_element: the width of every element of A, B and C (1, 2, 4, 8).
    -> (flops, bytes): a multiply-add counts as 2 FLOPs; bytes count A and B read once each and the
    [m, n] result written once, nothing re-read.
    """
    ### BEGIN SOLUTION
    flops = 2 * m * k * n
    return flops, (m * k + k * n + m * n) * bytes_per_element
    ### END SOLUTION


# %% [markdown]
# <details><summary>Hint 1: a nudge</summary>
#
# Redo the worked example with letters in place of 2, 3 and 4: how many entries does C have, and how
# many products go into each?
#
# </details>
# <details><summary>Hint 2: the idea</summary>
#
# C has `m × n` entries, each a dot product of length `k`. The bytes are the three matrices' sizes in
# elements, times the element width.
#
# </details>
# <details><summary>Hint 3: the formula</summary>
#
# FLOPs = 2·m·k·n; bytes = (m·k + k·n + m·n) · bytes_per_element.
#
# </details>

# %%
check("0.1")
for m in (1, 16, 256, 4096):
    f, b = matmul_cost(m, 4096, 4096, 2)
    print(f"[{m:4d}, 4096] @ [4096, 4096] in bf16: intensity {f / b:7.1f} FLOP/byte")

# %% [markdown]
# ## Exercise 0.2 · Roofline time (~5 min)
#
# A kernel needs its FLOPs done and its bytes moved. Take one that does 6 GFLOP and moves 2 GB on a
# machine of 100 GFLOP/s and 10 GB/s. The arithmetic alone would take 6e9 / 100e9 = 60 ms; the
# memory traffic alone 2e9 / 10e9 = 200 ms. Good kernels overlap the two: the arithmetic runs on data
# already fetched while the next data streams in. With perfect overlap, how long does this kernel
# take, and which resource would you have to make faster to speed it up? Answer that for this
# kernel, and you have the function. (It must also handle a kernel that does no arithmetic at all: a
# copy.)

# %% exercise="0.2"
def roofline_time(flops: float, bytes_moved: float, peak_flops: float, bandwidth: float) -> float:
    """The least time in seconds a kernel can take on a machine of the given two ceilings, compute and
    memory traffic overlapping perfectly.

    flops >= 0 (0 for a pure copy); bytes_moved >= 0; peak_flops in FLOP/s > 0; bandwidth in bytes/s > 0.
    -> seconds, a float.
    """
    ### BEGIN SOLUTION
    return max(flops / peak_flops, bytes_moved / bandwidth)
    ### END SOLUTION


# %% [markdown]
# <details><summary>Hint 1: a nudge</summary>
#
# With perfect overlap, the kernel is done when *both* jobs are done. Which of the two finishes last?
#
# </details>
# <details><summary>Hint 2: the idea</summary>
#
# Work out each resource's time on its own, as in the example, and keep the longer. Adding them
# assumes no overlap at all; taking the shorter assumes the slower job is free.
#
# </details>
# <details><summary>Hint 3: the formula</summary>
#
# time = max(flops / peak_flops, bytes_moved / bandwidth).
#
# </details>

# %%
check("0.2")

# %% [markdown]
# ## Exercise 0.3 · The cost of attention (~10 min)
#
# Attention does two matmuls per query head: the scores `q kᵀ` (`[q_len, head_dim] @ [head_dim, kv_len]`)
# and the weighted sum `p v` (`[q_len, kv_len] @ [kv_len, head_dim]`). Take one head, `q_len = 2`
# queries, `kv_len = 3` keys, `head_dim = 4`. The scores are 2 × 3 dot products of length 4: 24
# multiply-adds. The weighted sum has 2 × 4 outputs, each a sum over 3 keys: another 24. That head
# costs 48 multiply-adds, 96 FLOPs. Count every (query, key) pair, as kernels that do not skip
# masked blocks do.
#
# Memory: the kernel reads `q` and writes its output, both one vector per query *per query head*;
# it reads `k` and `v`, one vector per key *per kv head*. With grouped-query attention (GQA), several
# query heads share one kv head, so `k` and `v` are narrower than `q`: that is what GQA saves. In the
# example with 1 head on 1 kv head in float32: q 2×4, output 2×4, k 3×4, v 3×4, 40 numbers, 160 bytes.
# The scores themselves stay on chip in a fused kernel (FlashAttention): don't count them.

# %% exercise="0.3"
def attention_cost(q_len: int, kv_len: int, heads: int, kv_heads: int, head_dim: int,
                   bytes_per_element: int) -> tuple[float, float]:
    """FLOPs and minimum bytes of one attention layer for one sequence.

    q_len queries over kv_len >= q_len keys; heads query heads share kv_heads kv heads (heads is a
    multiple of kv_heads); head_dim per head; every tensor bytes_per_element wide.
    -> (flops, bytes): FLOPs of both matmuls on every query head over every (query, key) pair, a
    multiply-add as 2; bytes of q read, the output written, k and v read, each once. The score
    matrix is not counted.
    """
    ### BEGIN SOLUTION
    flops = 4 * q_len * kv_len * heads * head_dim
    elements = 2 * q_len * heads * head_dim + 2 * kv_len * kv_heads * head_dim
    return flops, elements * bytes_per_element
    ### END SOLUTION


# %% [markdown]
# <details><summary>Hint 1: a nudge</summary>
#
# Do the worked example for one head with letters, then ask which of the four tensors grow with
# `heads` and which with `kv_heads`.
#
# </details>
# <details><summary>Hint 2: the idea</summary>
#
# Both matmuls cost `q_len × kv_len × head_dim` multiply-adds per query head. q and the output are
# `q_len × heads × head_dim` elements each; k and v are `kv_len × kv_heads × head_dim` each.
#
# </details>
# <details><summary>Hint 3: the formula</summary>
#
# FLOPs = 4·q_len·kv_len·heads·head_dim;
# bytes = (2·q_len·heads·head_dim + 2·kv_len·kv_heads·head_dim) · bytes_per_element.
#
# </details>

# %%
check("0.3")
for q_len in (1, 4096):
    f, b = attention_cost(q_len, 4096, 32, 8, 128, 2)
    print(f"attention, {q_len:4d} queries over 4096 keys (32 heads on 8 kv heads): {f / b:6.1f} FLOP/byte")

# %% [markdown]
# ## Exercise 0.4 · The size of the KV cache (~5 min)
#
# A decoder keeps, for every token it has seen, that token's key and value in every layer, so that a
# later token can attend to it without recomputing it. Take a model of 2 layers with 1 kv head of
# `head_dim = 4`, after 3 tokens, in float16: each token left a key (4 numbers) and a value (4 numbers)
# in each of the 2 layers, 16 numbers a token, 48 for the 3 tokens, 96 bytes. Only kv heads are
# stored: the query heads are used and thrown away.
#
# `cfg` is a `ModelConfig`: its sizes are `cfg.num_hidden_layers`, `cfg.num_key_value_heads` and
# `cfg.head_dim` (which need not be `hidden_size / num_attention_heads`).

# %% exercise="0.4"
def kv_cache_bytes(cfg: ModelConfig, num_tokens: int, bytes_per_element: int) -> int:
    """Bytes a KV cache takes to hold the keys and values of num_tokens tokens, in every layer.

    cfg: the model's sizes (layers, kv heads, head_dim; GQA: kv heads, not query heads, are cached);
    num_tokens >= 1, summed over all sequences; bytes_per_element: the cache's element width.
    -> bytes, as much as a cache of that many tokens allocates.
    """
    ### BEGIN SOLUTION
    return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * num_tokens * bytes_per_element
    ### END SOLUTION


# %% [markdown]
# <details><summary>Hint 1: a nudge</summary>
#
# In the worked example, which of the numbers 2, 1, 4, 3 and 2 bytes came from the config, and where
# did the remaining factor of 2 come from?
#
# </details>
# <details><summary>Hint 2: the idea</summary>
#
# Per token and layer: one key and one value, each `kv_heads × head_dim` numbers. Multiply by the
# layers, the tokens and the width.
#
# </details>
# <details><summary>Hint 3: the formula</summary>
#
# bytes = 2 · layers · kv_heads · head_dim · num_tokens · bytes_per_element.
#
# </details>

# %%
check("0.4")

# %% [markdown]
# ## Exercise 0.5 · One decode step (~15 min)
#
# A decode step runs one new token for each of `batch_size` sequences. Two rules decide its cost:
#
# * **FLOPs.** Every token is multiplied by every weight once: one multiply-add per weight and token.
#   Each sequence's token also attends over its own context, in every layer (exercise 0.3, one query).
# * **Bytes.** The weights are read from memory once for the whole batch: all the sequences' tokens
#   use them while they are loaded. Each sequence's KV cache is read for its own token.
#
# A worked example on round numbers: a model of 1 M weights in float16 whose cache holds 0.5 MB per
# sequence at this context, at batch 3, with attention of 0.1 MFLOP per sequence. FLOPs: 2 × 1 M × 3 +
# 3 × 0.1 M = 6.3 MFLOP. Bytes: 2 MB of weights, once, + 3 × 0.5 MB of cache = 3.5 MB.
#
# What counts as a weight? Every weight a token is multiplied by. A Llama layer holds
# `q_proj [heads·d, hidden]`, `k_proj` and `v_proj [kv_heads·d, hidden]`, `o_proj [hidden, heads·d]`,
# `gate_proj` and `up_proj [intermediate, hidden]`, `down_proj [hidden, intermediate]` and two norm
# gains `[hidden]`; after the layers come the final norm `[hidden]` and the LM head `[vocab, hidden]`.
# The embedding table is not read whole (a lookup reads one row per token), so leave it out; when the
# embeddings are tied, it *is* the LM head, which you already counted. Reuse your 0.3 and 0.4.

# %% exercise="0.5"
def decode_step_cost(cfg: ModelConfig, context_len: int, batch_size: int,
                     bytes_per_element: int) -> tuple[float, float]:
    """FLOPs and minimum bytes of one decode step: batch_size sequences, one new token each, each
    attending over context_len positions of its own.

    cfg: the model's sizes (GQA, head_dim not hidden / heads, tied or untied embeddings);
    context_len >= 1; batch_size >= 1; bytes_per_element: the width of weights and cache alike.
    -> (flops, bytes). Weights counted: every weight a token is multiplied by (the LM head included,
    the embedding table not, since a lookup reads one row). Bytes: the weights read once for the
    batch, and each sequence's KV cache read once.
    """
    ### BEGIN SOLUTION
    h, d = cfg.hidden_size, cfg.head_dim
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    per_layer = h * (heads + 2 * kv_heads) * d + heads * d * h + 3 * h * cfg.intermediate_size + 2 * h
    params = cfg.num_hidden_layers * per_layer + h + cfg.vocab_size * h
    attn_flops, _ = attention_cost(1, context_len, heads, kv_heads, d, bytes_per_element)
    flops = 2 * params * batch_size + cfg.num_hidden_layers * batch_size * attn_flops
    return flops, params * bytes_per_element + kv_cache_bytes(cfg, batch_size * context_len, bytes_per_element)
    ### END SOLUTION


# %% [markdown]
# <details><summary>Hint 1: a nudge</summary>
#
# Split the work in two: first the number of weights `P` from the shapes above (a line per layer, a
# line for what follows the layers), then the step's FLOPs and bytes from `P` as in the worked example.
#
# </details>
# <details><summary>Hint 2: the idea</summary>
#
# A layer's weights: `hidden·(heads + 2·kv_heads)·d` for q, k, v, `heads·d·hidden` for o, three
# `hidden × intermediate` matrices for the MLP, and two norms. FLOPs grow with the batch in both
# terms; the weight bytes do not, the cache bytes do.
#
# </details>
# <details><summary>Hint 3: the formula</summary>
#
# P = layers·(hidden·(heads + 2·kv_heads)·d + heads·d·hidden + 3·hidden·intermediate + 2·hidden)
# + hidden + vocab·hidden;
# FLOPs = 2·P·batch + layers·batch·(attention FLOPs of 1 query over context_len keys);
# bytes = P·bytes_per_element + the KV cache of batch·context_len tokens.
#
# </details>

# %%
check("0.5")

# %% [markdown]
# ## Exercise 0.6 · Predicted decode speed (~5 min)
#
# A step produces one token per sequence of the batch. If a step of batch 8 takes 20 ms, the engine
# turns out 8 tokens every 20 ms: 400 tokens/s for the whole batch, 50 for each sequence. Put that
# together with your step cost and your roofline time.

# %% exercise="0.6"
def decode_tokens_per_s(cfg: ModelConfig, context_len: int, batch_size: int, peak_flops: float,
                        bandwidth: float, bytes_per_element: int) -> float:
    """The roofline's prediction of decode throughput: tokens/s summed over the batch, at the
    machine's peak_flops (FLOP/s) and bandwidth (bytes/s), weights and cache bytes_per_element wide.

    The arguments as in decode_step_cost and roofline_time. -> tokens/s > 0, a float; memory-bound
    or compute-bound, whichever the step is.
    """
    ### BEGIN SOLUTION
    flops, nbytes = decode_step_cost(cfg, context_len, batch_size, bytes_per_element)
    return batch_size / roofline_time(flops, nbytes, peak_flops, bandwidth)
    ### END SOLUTION


# %% [markdown]
# <details><summary>Hint 1: a nudge</summary>
#
# Which of your functions gives the step's time, and how many tokens does that step produce?
#
# </details>
# <details><summary>Hint 2: the idea</summary>
#
# The step's cost from 0.5, its time from 0.2, and the batch's tokens over that time.
#
# </details>
# <details><summary>Hint 3: the formula</summary>
#
# tokens/s = batch_size / roofline_time(step FLOPs, step bytes, peak_flops, bandwidth).
#
# </details>

# %%
check("0.6")

# %% [markdown]
# ## Measure it: this machine's two ceilings (~3 min)
#
# Bandwidth: copy a tensor far larger than the caches (256 MiB; every byte is read once and
# written once). Compute: a 1024 × 1024 float32 matmul (2 · 1024³ FLOPs). `minillm.perf` measures
# both as the median of five runs, the same functions the visualizer's roofline page calls, so
# the two show the same "this machine". A busy machine measures lower.

# %%
from minillm.perf import measure_bandwidth, measure_flops, median_time

cpu_bandwidth = measure_bandwidth(torch.device("cpu"))
cpu_flops = measure_flops(torch.device("cpu"), torch.float32)
print(f"this machine: {cpu_bandwidth / 1e9:.1f} GB/s, {cpu_flops / 1e9:.1f} GFLOP/s (float32, "
      f"{torch.get_num_threads()} threads), ridge {cpu_flops / cpu_bandwidth:.1f} FLOP/byte")

# %% [markdown]
# ## Hardware profiles (~5 min)
#
# Vendor peak numbers (dense, no sparsity, from NVIDIA's A100, H100 and H200 datasheets and Groq's LPU
# figures) next to what you just measured. The SRAM-based accelerator keeps weights in on-chip SRAM
# instead of HBM: enormous bandwidth, but only a few hundred MB per chip, so a model is spread over
# hundreds of chips.

# %%
HARDWARE = {  # name: (peak FLOP/s, bandwidth bytes/s, bytes per element used for the model)
    "this CPU (measured, fp32)": (cpu_flops, cpu_bandwidth, 4),
    "A100 SXM (bf16)": (312e12, 2.04e12, 2),
    "H100 SXM (bf16)": (989e12, 3.35e12, 2),
    "H200 SXM (bf16)": (989e12, 4.8e12, 2),
    "Groq LPU, SRAM (fp16)": (188e12, 80e12, 2),
}
fig = go.Figure()
for name, (p, bw, _) in HARDWARE.items():
    fig.add_trace(go.Scatter(x=intensity, y=[min(p, i * bw) / 1e12 for i in intensity], name=name))
for label, m in (("decode matvec (m=1)", 1), ("prefill matmul (m=2048)", 2048)):
    f, b = matmul_cost(m, 4096, 4096, 2)
    fig.add_vline(x=f / b, line_dash="dot", annotation_text=label, annotation_x=math.log10(f / b),
                  annotation_position="bottom right")
fig.update_layout(title="Rooflines, with the intensity of a 4096×4096 layer in decode and prefill",
                  xaxis_type="log", yaxis_type="log", xaxis_title="FLOP / byte", yaxis_title="attainable TFLOP/s",
                  height=420)
fig.show()

# %% [markdown]
# At an intensity near 1, decode sits far left of every ridge: each weight byte fetched is used for
# one multiply-add, so the step time is set by the bytes of weights over the bandwidth, and the
# compute units mostly wait. Prefill reuses each weight for every prompt token and climbs to the flat
# roof. Batching many sequences' decode steps raises intensity the same way, which is why servers
# batch. Here is your `decode_tokens_per_s` for a Llama-3-8B-shaped model at a 1024-token context:
# find, on each curve, the batch where it stops growing in proportion to the batch.

# %%
llama8b = ModelConfig(architecture="LlamaForCausalLM", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                      num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                      max_position_embeddings=8192)
batches = [1, 4, 16, 64, 256, 1024]
fig = go.Figure([go.Scatter(x=batches, y=[decode_tokens_per_s(llama8b, 1024, n, p, bw, 2) for n in batches],
                            name=name, mode="lines+markers") for name, (p, bw, _) in list(HARDWARE.items())[1:]])
fig.update_layout(title="Predicted decode throughput, 8B model, bf16, 1024-token context", xaxis_type="log",
                  yaxis_type="log", xaxis_title="batch size", yaxis_title="tokens/s (whole batch)", height=380)
fig.show()

# %% [markdown]
# ## Prediction against measurement, on weights of growing size (~7 min)
#
# Build decoders of growing size with random weights, time one decode step (one token through
# every weight), and compare with your roofline prediction from the measured ceilings. The first
# has the bundled model's shape. Before you run the cell, guess: which of the three will reach the
# largest share of its prediction, and why?

# %%
base = LLM(MODEL).model.config
sizes = [(base.hidden_size, base.intermediate_size, base.num_hidden_layers), (512, 1536, 8), (1024, 2816, 8)]
rows = []
with torch.inference_mode():
    for hidden, inter, layers in sizes:
        cfg = ModelConfig(architecture="LlamaForCausalLM", vocab_size=base.vocab_size, hidden_size=hidden,
                          intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=hidden // 32,
                          num_key_value_heads=hidden // 64, head_dim=32, max_position_embeddings=64,
                          tie_word_embeddings=True)
        model = LlamaForCausalLM(cfg).eval()
        one = torch.tensor([1])
        measured = 1 / median_time(lambda: model.compute_logits(model(one, one)), repeats=3 if quick_run() else 7)
        predicted = decode_tokens_per_s(cfg, 1, 1, cpu_flops, cpu_bandwidth, 4)
        megabytes = decode_step_cost(cfg, 1, 1, 4)[1] / 1e6
        rows.append((f"{megabytes:.0f} MB of weights", predicted, measured))
fig = go.Figure([go.Bar(name="roofline prediction", x=[r[0] for r in rows], y=[r[1] for r in rows]),
                 go.Bar(name="measured forward", x=[r[0] for r in rows], y=[r[2] for r in rows])])
fig.update_layout(title="Decode tokens/s at batch 1: prediction vs measurement", barmode="group",
                  yaxis_type="log", yaxis_dtick="D2", yaxis_title="tokens/s", height=360)
fig.show()
for label, predicted, measured in rows:
    print(f"{label:>22}: predicted {predicted:8.1f} tok/s, measured {measured:8.1f} tok/s ({measured / predicted:.0%})")
shares = [measured / predicted for _, predicted, measured in rows]
print("on this run, the share of the prediction reached", "grows" if shares == sorted(shares) else "does not grow",
      f"steadily with the weights' size ({', '.join(f'{s:.0%}' for s in shares)})")

# %% [markdown]
# Read your run's shares. The roofline counts only weight bytes and FLOPs; a small model's step also
# pays fixed overheads that neither ceiling counts (Python, ~100 small operator calls; on GPUs, kernel
# launches, which engines remove with CUDA graphs), and a small model's weights may sit in the CPU's
# caches, faster than the DRAM bandwidth you measured. So where the share grows with size, memory
# traffic is taking over the step: decode is becoming memory-bound. The rest of the gap is honest too:
# matrix-vector products rarely sustain the bandwidth of a plain copy, and a busy machine gives less
# of both.

# %% [markdown]
# ## Predict, then measure: SmolLM2's decode on this machine (~15 min)
#
# Every model above has random weights, and `tiny`'s 23 MB of weights can sit in a large CPU's caches,
# so its decode need not meet the memory wall. A real, trained model does: SmolLM2-135M-Instruct (30
# layers, hidden 576, 9 query heads on 3 kv heads, a 49,152-token vocabulary, embeddings tied to the LM
# head) is about 540 MB in float32, more than any CPU's caches. Each decode step must stream all of it
# from DRAM, which is exactly the situation your roofline describes, and the one a GPU serves in.
#
# Two bandwidths can go into a prediction: the copy's, as above, and the one a matrix-vector product
# reaches over a 256 MiB matrix, the operation a decode step actually streams its weights with. The
# next cell measures both, and the FLOP/s, on one thread, and loads the real model (the first load
# converts its file, once). One thread: on a shared machine a second thread can spend a step waiting
# for a core, a cost the roofline does not model. If the model's package is not installed, the cell
# says how to install it and the section is skipped.

# %%
from minillm.labkit import REAL_MODEL, compare, real_model_installed

have_real = real_model_installed()
if have_real:
    torch.set_num_threads(1)
    one_flops = measure_flops(torch.device("cpu"), torch.float32)
    copy_bandwidth = measure_bandwidth(torch.device("cpu"))
    matrix, vector = torch.randn(8192, 8192), torch.randn(8192)  # 256 MiB of float32, far beyond the caches
    matvec_bandwidth = matrix.numel() * 4 / median_time(lambda: matrix @ vector, repeats=5)
    del matrix
    real = LLM(REAL_MODEL)
    real_cfg = real.model.config
    print(f"one thread: {one_flops / 1e9:.1f} GFLOP/s; copy {copy_bandwidth / 1e9:.1f} GB/s, "
          f"matrix-vector product {matvec_bandwidth / 1e9:.1f} GB/s")
    print(f"{REAL_MODEL}: real_cfg has {real_cfg.num_hidden_layers} layers, hidden {real_cfg.hidden_size}, "
          f"intermediate {real_cfg.intermediate_size}, vocab {real_cfg.vocab_size}, weights in float32")

# %% [markdown]
# **Your prediction.** Before the next cell measures anything, work out the decode speed you expect
# `minillm`'s engine to reach on SmolLM2 at batch 1, in float32, on one thread, over a context of about
# 40 tokens. Start from the bound: the bytes of one step (your `decode_step_cost(real_cfg, ...)`, or by
# hand from the shapes above) over the bandwidth a decode step can use. Then decide: what share of that
# bound will a real engine reach, with its 121 separate weight matrices (four per layer, and the LM
# head), sampling and bookkeeping on every step? Write the number down.

# %%
MY_PREDICTION = None  # tok/s: SmolLM2's decode at batch 1 on one thread here, from the roofline above

# %% [markdown]
# The cell below measures one bare forward step of each model (one token through every weight) and
# the engine's decode over a 32-token prompt, then sets your prediction beside the bandwidth bound
# your `decode_tokens_per_s` gives at this machine's measured (copy) bandwidth, the roofline's own.

# %%
if have_real:
    repeats, new_tokens = (3, 8) if quick_run() else (7, 32)
    context = 32 + new_tokens // 2  # the mean context of the measured decode steps
    real_rows = []
    for name, llm in ((MODEL, LLM(MODEL)), (REAL_MODEL, real)):
        cfg, model = llm.model.config, llm.model
        one = torch.tensor([1])
        with torch.inference_mode():
            forward = 1 / median_time(lambda: model.compute_logits(model(one, one)), repeats=repeats)
        out = llm.generate([list(range(1, 33))], SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True),
                           use_tqdm=False)[0]
        real_rows.append({"model": f"{name} ({decode_step_cost(cfg, context, 1, 4)[1] / 1e6:.0f} MB)",
                          "bound, copy bandwidth": decode_tokens_per_s(cfg, context, 1, one_flops, copy_bandwidth, 4),
                          "bound, matvec bandwidth": decode_tokens_per_s(cfg, context, 1, one_flops,
                                                                         matvec_bandwidth, 4),
                          "measured forward": forward, "minillm's engine": 1 / out.metrics["tpot"]})
    series = [k for k in real_rows[0] if k != "model"]
    fig = go.Figure([go.Bar(name=k, x=[r["model"] for r in real_rows], y=[r[k] for r in real_rows]) for k in series])
    fig.update_layout(title="Decode tokens/s at batch 1: the tiny model, and a real 135M model",
                      barmode="group", yaxis_type="log", yaxis_dtick="D2", yaxis_title="tokens/s", height=380)
    fig.show()
    for r in real_rows:
        print(f"{r['model']:>36}: " + ", ".join(f"{k} {r[k]:.1f}" for k in series) + " tok/s; the engine reaches "
              f"{r[series[-1]] / r['bound, copy bandwidth']:.0%} of the copy bound, "
              f"{r[series[-1]] / r['bound, matvec bandwidth']:.0%} of the matvec one")
    smol = real_rows[1]
    share, mb = smol["minillm's engine"] / smol["bound, copy bandwidth"], smol["model"].split("(")[1][:-1]
    compare("SmolLM2 decode at batch 1, float32, one thread", MY_PREDICTION, theory=smol["bound, copy bandwidth"],
            measured=smol["minillm's engine"], unit="tok/s", theory_name="bandwidth bound",
            gap=(f"the engine reaches {share:.0%} of the bound: each step streams {mb} as 121 matrices of a few MB "
                 "and pays for sampling and bookkeeping, which a copy of one large tensor does not."
                 if share <= 1 else
                 f"the engine ran {share:.2f}x above the bound: the bandwidth measured a moment earlier was lower "
                 "than what the decode steps got, so the machine's load changed between the two (run both again)."))
    del real

# %% [markdown]
# Read your figures. For both models your roofline says "memory-bound": at batch 1 in float32 a
# decode step does 2 FLOPs per 4 bytes of weights, an intensity of 0.5, left of any CPU's ridge. The
# real model is the one whose step is one pass over its weights from DRAM, so its tokens/s is set by
# bandwidth over weight bytes; if your run shows it reaching a larger share of its bound than `tiny`,
# that is why. `tiny`'s step goes largely to the fixed cost of a few hundred small operator calls,
# which neither ceiling counts, and its weights may come from the caches, not DRAM. Of the two
# bandwidths, the copy's is the roofline's own ceiling; the matrix-vector product's is what one large
# product of the decode's kind got. Which is higher can change from run to run on a shared machine,
# since each is measured over a fraction of a second: run the cells twice and see how much your figures
# move before you read anything into a difference of a few percent. The engine adds sampling and
# bookkeeping to each step: compare it with the bare forward in your table. Where the engine comes out
# faster, that per-step cost is smaller than the machine's noise.
# If your prediction was far off, find which step of your reasoning was: the bytes, the bandwidth, or
# the share you expected the engine to reach.
#
# A weight-bound model gains from anything that uses each weight byte it reads for more tokens: a
# batch (lab 04), fewer bytes per weight (lab 06), several tokens checked in one step (lab 05).

# %% [markdown]
# ## How production engines do it (~5 min)
#
# * **Batching** is the main lever on decode throughput: vLLM, SGLang and TensorRT-LLM run the
#   decode steps of many requests as one batch, so each weight byte serves many tokens (lab 04).
# * **Fewer bytes per weight.** Quantization to int8, fp8 or int4 (AWQ, GPTQ, TensorRT-LLM's fp8)
#   speeds memory-bound decode almost in proportion to the bytes saved (lab 06).
# * **Fewer bytes of KV cache.** GQA, paged caches (vLLM's PagedAttention) and fp8 KV caches let
#   more sequences fit and shrink the attention traffic that dominates at long contexts (lab 03).
# * **Removing overheads.** CUDA graphs (vLLM, SGLang) and compiled engines (TensorRT-LLM) replay
#   a whole decode step without per-kernel CPU work: the fixed per-step cost that weighs most on small models.
# * **Roofline thinking** drives kernel work: FlashAttention raises attention's intensity by keeping
#   tiles in on-chip SRAM; speculative decoding (lab 05) turns memory-bound single-token steps into
#   a few-token verification with more FLOPs per byte.
