# %% [markdown]
# # Lab 00 · The roofline and the memory wall
#
# **Time:** about 60 minutes. **You need:** Python; no PyTorch beyond creating tensors.
#
# Before optimising an inference engine, know what limits it. A processor can do two things fast:
# arithmetic (FLOP/s) and moving bytes from memory (bytes/s). Every kernel needs some of each, and
# whichever takes longer sets its time. This lab builds the *roofline model* from that one idea,
# measures this machine, and uses the model to predict how fast a language model can decode, and
# why generating text one token at a time is limited by memory bandwidth, not by arithmetic.
#
# ## Learning objectives
# By the end you can
# 1. count the FLOPs and bytes of a matmul, a matrix-vector product and attention, and compute their
#    **arithmetic intensity**;
# 2. predict a kernel's time with the roofline: `max(FLOPs / peak FLOP/s, bytes / bandwidth)`;
# 3. count the bytes a decode step must move (weights + KV cache) and predict decode tokens/s for any
#    model on any hardware;
# 4. explain why decode is memory-bound and prefill compute-bound, and why batching helps decode;
# 5. compare your prediction with `minillm`'s measured decode speed on this machine.
#
# ## How this lab works
# Write code only in the exercise cells (they contain `raise NotImplementedError`), keeping names
# and signatures. Run each `check(...)` cell for feedback; `make grade LAB=00` grades the notebook.
# Units: FLOPs, bytes, seconds; a multiply-add counts as 2 FLOPs.

# %% tags=["setup"]
from minillm.labkit import check
from minillm.models.model_config import ModelConfig

# %%
import plotly.graph_objects as go
import torch

from minillm import LLM, SamplingParams
from minillm.models.llama import LlamaForCausalLM

MODEL = "tiny"  # the bundled model: a 6-layer Llama-style decoder trained on Python code

# %% [markdown]
# ## The concept: two ceilings
#
# **Arithmetic intensity** `I = FLOPs / bytes moved` is a property of the work. A machine with peak
# compute `P` (FLOP/s) and memory bandwidth `B` (bytes/s) can sustain at most `min(P, I × B)` FLOP/s:
# below the *ridge point* `I = P / B` the memory ceiling binds, above it the compute ceiling. On a
# log-log plot that is a slanted roof meeting a flat one, hence the name. An H100 has a ridge near
# 300 FLOP/byte: work that does fewer than ~300 FLOPs per byte it touches leaves the tensor cores idle.

# %%
import math

intensity = [2 ** e for e in range(-2, 13)]
peak, bandwidth = 989e12, 3.35e12  # H100 SXM: dense bf16 tensor-core FLOP/s, HBM3 bytes/s
ridge = peak / bandwidth
fig = go.Figure(go.Scatter(x=intensity, y=[min(peak, i * bandwidth) / 1e12 for i in intensity], name="H100 roofline"))
# On a log axis plotly places a line (a shape) at the value itself but its label (an annotation) at log10 of it.
fig.add_vline(x=ridge, line_dash="dot", annotation_text=f"ridge ≈ {ridge:.0f} FLOP/B", annotation_x=math.log10(ridge),
              annotation_position="bottom right")
fig.update_layout(title="The roofline of an H100", xaxis_type="log", yaxis_type="log", height=360,
                  xaxis_title="arithmetic intensity (FLOP / byte)", yaxis_title="attainable TFLOP/s")
fig.show()

# %% [markdown]
# ## Exercise 0.1 · The cost of a matmul
#
# `C = A @ B` with `A: [m, k]`, `B: [k, n]` does `m·n·k` multiply-adds. At best it reads `A` and
# `B` once and writes `C` once. With `m = 1` it is a matrix-vector product: the shape of a decode
# step, where one token meets every weight matrix.

# %% exercise="0.1"
def matmul_cost(m: int, k: int, n: int, bytes_per_element: int) -> tuple[float, float]:
    """FLOPs and minimum bytes moved by [m, k] @ [k, n] -> [m, n].

    flops = 2 * m * k * n; bytes = (m*k + k*n + m*n) * bytes_per_element

    Hints: 2 lines.
    """
    ### BEGIN SOLUTION
    flops = 2 * m * k * n
    return flops, (m * k + k * n + m * n) * bytes_per_element
    ### END SOLUTION


# %%
check("0.1")
for m in (1, 16, 256, 4096):
    f, b = matmul_cost(m, 4096, 4096, 2)
    print(f"[{m:4d}, 4096] @ [4096, 4096] in bf16: intensity {f / b:7.1f} FLOP/byte")

# %% [markdown]
# ## Exercise 0.2 · Roofline time
#
# If compute and memory traffic overlap perfectly (good kernels come close), a kernel takes as
# long as the slower of the two.

# %% exercise="0.2"
def roofline_time(flops: float, bytes_moved: float, peak_flops: float, bandwidth: float) -> float:
    """Lower bound on a kernel's time in seconds: max(flops / peak_flops, bytes_moved / bandwidth).

    Hints: 1 line.
    """
    ### BEGIN SOLUTION
    return max(flops / peak_flops, bytes_moved / bandwidth)
    ### END SOLUTION


# %%
check("0.2")

# %% [markdown]
# ## Exercise 0.3 · The cost of attention
#
# Attention of `q_len` queries over `kv_len` keys does two matmuls per query head: scores
# `q kᵀ` and the weighted sum `p v`, each `q_len × kv_len × head_dim` multiply-adds. Count every
# (query, key) pair, as kernels that do not skip masked blocks do. Memory: read `q`, write the
# output (both `heads` wide), read `k` and `v` (only `kv_heads` wide: that is what GQA saves).

# %% exercise="0.3"
def attention_cost(q_len: int, kv_len: int, heads: int, kv_heads: int, head_dim: int,
                   bytes_per_element: int) -> tuple[float, float]:
    """FLOPs and bytes of one attention layer for one sequence.

    flops = 4 * q_len * kv_len * heads * head_dim
    bytes = (2 * q_len * heads * head_dim + 2 * kv_len * kv_heads * head_dim) * bytes_per_element

    Hints: 3 lines.
    """
    ### BEGIN SOLUTION
    flops = 4 * q_len * kv_len * heads * head_dim
    elements = 2 * q_len * heads * head_dim + 2 * kv_len * kv_heads * head_dim
    return flops, elements * bytes_per_element
    ### END SOLUTION


# %%
check("0.3")
for q_len in (1, 4096):
    f, b = attention_cost(q_len, 4096, 32, 8, 128, 2)
    print(f"attention, {q_len:4d} queries over 4096 keys (32 heads on 8 kv heads): {f / b:6.1f} FLOP/byte")

# %% [markdown]
# ## Exercise 0.4 · The size of the KV cache
#
# Every token of every sequence keeps one key and one value vector per kv head in every layer.
# `cfg` is a `ModelConfig`: use `cfg.num_hidden_layers`, `cfg.num_key_value_heads`, `cfg.head_dim`.

# %% exercise="0.4"
def kv_cache_bytes(cfg: ModelConfig, num_tokens: int, bytes_per_element: int) -> int:
    """Bytes of the keys and values of num_tokens tokens, all layers.

    bytes = 2 * layers * kv_heads * head_dim * num_tokens * bytes_per_element

    Hints: 1 line.
    """
    ### BEGIN SOLUTION
    return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * num_tokens * bytes_per_element
    ### END SOLUTION


# %%
check("0.4")

# %% [markdown]
# ## Exercise 0.5 · One decode step
#
# A decode step runs one new token for each of `batch_size` sequences. The weights are read once
# for the whole batch; each sequence's cache is read for its own token. Count as parameters `P`
# every weight a token is multiplied by:
#
# * per layer: `q_proj [heads·d, hidden]`, `k_proj` and `v_proj [kv_heads·d, hidden]`, `o_proj [hidden, heads·d]`,
#   `gate_proj` and `up_proj [intermediate, hidden]`, `down_proj [hidden, intermediate]`, two norms `[hidden]`;
# * the final norm `[hidden]` and the LM head `[vocab, hidden]`.
#
# The embedding table is not read whole (a lookup reads one row per token), so leave it out; when
# the embeddings are tied it *is* the LM head, which you already counted. Then
#
# * FLOPs = `2·P·batch` + per layer and sequence, the attention FLOPs of 1 query over `context_len` keys;
# * bytes = `P·bytes_per_element` + the KV cache of `batch·context_len` tokens.

# %% exercise="0.5"
def decode_step_cost(cfg: ModelConfig, context_len: int, batch_size: int,
                     bytes_per_element: int) -> tuple[float, float]:
    """FLOPs and bytes of one decode step: batch_size sequences, each attending over context_len positions.

    P = layers * (hidden*(heads + 2*kv_heads)*head_dim + heads*head_dim*hidden + 3*hidden*intermediate
        + 2*hidden) + hidden + vocab*hidden
    flops = 2*P*batch + layers * batch * attention_cost(1, context_len, ...) FLOPs
    bytes = P*bytes_per_element + kv_cache_bytes(cfg, batch*context_len, bytes_per_element)

    Hints: about 7 lines, using attention_cost and kv_cache_bytes.
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


# %%
check("0.5")

# %% [markdown]
# ## Exercise 0.6 · Predicted decode speed
#
# A step produces one token per sequence, so tokens/s = `batch_size / step time`.

# %% exercise="0.6"
def decode_tokens_per_s(cfg: ModelConfig, context_len: int, batch_size: int, peak_flops: float,
                        bandwidth: float, bytes_per_element: int) -> float:
    """Roofline prediction of decode throughput (tokens/s summed over the batch).

    tokens/s = batch_size / roofline_time(*decode_step_cost(...), peak_flops, bandwidth)

    Hints: 2 lines.
    """
    ### BEGIN SOLUTION
    flops, nbytes = decode_step_cost(cfg, context_len, batch_size, bytes_per_element)
    return batch_size / roofline_time(flops, nbytes, peak_flops, bandwidth)
    ### END SOLUTION


# %%
check("0.6")

# %% [markdown]
# ## Measure it: this machine's two ceilings
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
# ## Hardware profiles
#
# Vendor peak numbers (dense, no sparsity) next to what you just measured. The SRAM-based
# accelerator keeps weights in on-chip SRAM instead of HBM: enormous bandwidth, but only a few
# hundred MB per chip, so a model is spread over hundreds of chips.

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
# At intensity ~1, decode sits far left of every ridge: each weight byte fetched is used for one
# multiply-add, so the step time is "bytes of weights / bandwidth" and the compute units mostly
# wait. Prefill reuses each weight for every prompt token and climbs to the flat roof. Batching
# many sequences' decode steps raises intensity the same way, which is why servers batch.
# Here is the prediction for a Llama-3-8B-shaped model at a 1024-token context:

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
# ## Prediction vs measurement on this machine
#
# Build decoders of growing size with random weights, time one decode step (one token through
# every weight), and compare with your roofline prediction from the measured ceilings. The first
# has the bundled model's shape: its weights are so small that fixed per-step overheads (Python,
# ~100 small operator calls) weigh more than the memory traffic.

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
        measured = 1 / median_time(lambda: model.compute_logits(model(one, one)), repeats=7)
        predicted = decode_tokens_per_s(cfg, 1, 1, cpu_flops, cpu_bandwidth, 4)
        megabytes = decode_step_cost(cfg, 1, 1, 4)[1] / 1e6
        rows.append((f"{megabytes:.0f} MB of weights", predicted, measured))
out = LLM(MODEL).generate([list(range(1, 33))], SamplingParams(max_tokens=16, temperature=0, ignore_eos=True))[0]
fig = go.Figure([go.Bar(name="roofline prediction", x=[r[0] for r in rows], y=[r[1] for r in rows]),
                 go.Bar(name="measured forward", x=[r[0] for r in rows], y=[r[2] for r in rows])])
fig.update_layout(title="Decode tokens/s at batch 1: prediction vs measurement", barmode="group",
                  yaxis_type="log", yaxis_dtick="D2", yaxis_title="tokens/s", height=360)
fig.show()
for label, predicted, measured in rows:
    print(f"{label:>22}: predicted {predicted:8.1f} tok/s, measured {measured:8.1f} tok/s ({measured / predicted:.0%})")
print(f"minillm's engine on the bundled model (sampling and bookkeeping included): {1 / out.metrics['tpot']:.1f} tok/s")

# %% [markdown]
# The larger the weights, the larger the share of the prediction the measurement reaches: memory
# traffic dominates more and more, and decode is memory-bound. For the smallest model the
# prediction is far too optimistic: its time goes to fixed overheads that the roofline does not
# model (on GPUs, kernel launches; engines remove them with CUDA graphs). The rest of the gap is
# honest too: matrix-vector products rarely sustain the bandwidth of a plain copy, and a busy
# machine gives less of both.

# %% [markdown]
# ## On a real model
#
# Every model above has random weights, and `tiny`'s 23 MB fit in this CPU's caches, so its decode
# never meets the memory wall. A real, trained model does: SmolLM2-135M-Instruct (30 layers, hidden
# 576, 9 query heads on 3 kv heads, a 49,152-token vocabulary, embeddings tied to the LM head) is
# about 540 MB in float32, far more than any cache. Each decode step must stream all of it from
# DRAM, which is exactly the situation your roofline describes, and the one a GPU serves in.
#
# The cell below predicts the decode speed of both models with your `decode_tokens_per_s`, from
# this machine's ceilings, then measures one forward step of each and the engine's decode. Two
# bandwidths go into the prediction: the copy's, as above, and the one a matrix-vector product
# reaches over a 256 MiB matrix, which is the operation a decode step actually streams its weights
# with. The cell pins torch to one thread and measures the ceilings on that thread: on a shared
# machine, a second thread can spend a step waiting for a core, a cost the roofline does not
# model. It loads the real model if its package is installed (the first load converts the file,
# once) and otherwise tells you how to install it.

# %%
from minillm.labkit import REAL_MODEL, real_model_installed

if real_model_installed():
    torch.set_num_threads(1)
    one_flops = measure_flops(torch.device("cpu"), torch.float32)
    copy_bandwidth = measure_bandwidth(torch.device("cpu"))
    matrix, vector = torch.randn(8192, 8192), torch.randn(8192)  # 256 MiB of float32, far beyond the caches
    matvec_bandwidth = matrix.numel() * 4 / median_time(lambda: matrix @ vector, repeats=5)
    del matrix
    print(f"one thread: {one_flops / 1e9:.1f} GFLOP/s; copy {copy_bandwidth / 1e9:.1f} GB/s, "
          f"matrix-vector product {matvec_bandwidth / 1e9:.1f} GB/s")
    real_rows = []
    for name in (MODEL, REAL_MODEL):
        llm = LLM(name)
        cfg, model = llm.model.config, llm.model
        one = torch.tensor([1])
        with torch.inference_mode():
            measured = 1 / median_time(lambda: model.compute_logits(model(one, one)), repeats=5)
        out = llm.generate([list(range(1, 33))], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True),
                           use_tqdm=False)[0]
        real_rows.append({"model": f"{name} ({decode_step_cost(cfg, 1, 1, 4)[1] / 1e6:.0f} MB)",
                          "predicted, copy bandwidth": decode_tokens_per_s(cfg, 1, 1, one_flops, copy_bandwidth, 4),
                          "predicted, matvec bandwidth": decode_tokens_per_s(cfg, 1, 1, one_flops, matvec_bandwidth, 4),
                          "measured forward": measured, "minillm's engine": 1 / out.metrics["tpot"]})
        del llm, model
    series = [k for k in real_rows[0] if k != "model"]
    fig = go.Figure([go.Bar(name=k, x=[r["model"] for r in real_rows], y=[r[k] for r in real_rows]) for k in series])
    fig.update_layout(title="Decode tokens/s at batch 1: cache-resident tiny, and a real 135M model",
                      barmode="group", yaxis_type="log", yaxis_dtick="D2", yaxis_title="tokens/s", height=380)
    fig.show()
    for r in real_rows:
        share = r["measured forward"] / r["predicted, matvec bandwidth"]
        print(f"{r['model']:>36}: " + ", ".join(f"{k} {r[k]:.1f}" for k in series)
              + f" tok/s; measured = {share:.0%} of the matvec prediction")

# %% [markdown]
# For both models your roofline says "memory-bound": at batch 1 in float32 a decode step does
# 2 FLOPs per 4 bytes of weights, an intensity of 0.5, left of any CPU's ridge. The real model is
# the one that behaves that way. Its step is one pass over 540 MB of weights, so its tokens/s is
# set by bandwidth / weight bytes, and it reaches a larger share of your prediction than `tiny`
# does (the percentages above, on this machine). The rest of its gap: a step streams the weights
# as 121 separate matrices of a few MB each (four per layer, and the LM head), and small matrices
# do not sustain the rate of one 256 MiB matrix; a busy machine gives less still. `tiny` stays
# further below: its weights come from the caches, not DRAM, and much of its step goes to the
# fixed cost of a few hundred small operator calls, which neither ceiling counts. The copy
# bandwidth gives the more optimistic prediction, an upper bound. The engine adds sampling and
# bookkeeping to each step, so it runs below the bare forward, most visibly on `tiny`.
# A weight-bound model gains from anything that uses each weight byte it reads for more tokens: a
# batch (lab 04), fewer bytes per weight (lab 06), several tokens checked in one step (lab 05).

# %% [markdown]
# ## How production engines do it
#
# * **Batching** is the main lever on decode throughput: vLLM, SGLang and TensorRT-LLM run the
#   decode steps of many requests as one batch, so each weight byte serves many tokens (lab 04).
# * **Fewer bytes per weight.** Quantization to int8, fp8 or int4 (AWQ, GPTQ, TensorRT-LLM's fp8)
#   speeds memory-bound decode almost in proportion to the bytes saved (lab 06).
# * **Fewer bytes of KV cache.** GQA, paged caches (vLLM's PagedAttention) and fp8 KV caches let
#   more sequences fit and shrink the attention traffic that dominates at long contexts (lab 03).
# * **Removing overheads.** CUDA graphs (vLLM, SGLang) and compiled engines (TensorRT-LLM) replay
#   a whole decode step without per-kernel CPU work: the gap you saw on the smallest model.
# * **Roofline thinking** drives kernel work: FlashAttention raises attention's intensity by keeping
#   tiles in on-chip SRAM; speculative decoding (lab 05) turns memory-bound single-token steps into
#   a few-token verification with more FLOPs per byte.
