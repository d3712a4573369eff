# %% [markdown]
# # Lab 02 · Generation and the KV cache
#
# **Time:** about 90 minutes. **You need:** lab 01 (attention with an offset causal mask).
#
# A model gives scores for the *next* token. Generating text means calling it again and again, one
# token at a time. Done naively, every call recomputes the whole sequence; an inference engine
# instead keeps each layer's keys and values (the **KV cache**), so a new token costs one token's
# work. In this lab you build that cache, the generation loop around it, and the sampler that turns
# scores into tokens, then you measure what the cache buys.
#
# ## Learning objectives
# By the end you can
# 1. tell **prefill** (the prompt, many tokens at once) from **decode** (one token per step) and say
#    why their costs differ;
# 2. write a KV cache that plugs into a real engine's model, with the positions right;
# 3. implement greedy, temperature, top-k and top-p sampling, reproducibly seeded;
# 4. define and measure **TTFT** (time to first token) and **TPOT** (time per output token);
# 5. plot the speedup of cached decode over recomputation against context length, and explain its shape.
#
# ## How this lab works
# Write code only in the exercise cells (they contain `raise NotImplementedError`), keeping names
# and signatures. Run each `check(...)` cell for feedback; `make grade LAB=02` grades the notebook.
#
# You will drive `minillm`'s own model. Its forward pass is
# `model(input_ids [n], positions [n], ctx) -> hidden [n, hidden]` and `model.compute_logits(hidden)
# -> [n, vocab]`. Every attention layer hands its new `q, k, v` to `ctx.attend(layer_idx, q, k, v)`:
# that seam is where your cache goes.

# %% tags=["setup"]
import torch
from torch import Tensor

from minillm.labkit import check
from minillm.layers.attention import AttentionContext, causal_attention
from minillm.models.model_config import ModelConfig

# %%
import time

import plotly.graph_objects as go

from minillm import LLM, SamplingParams

llm = LLM("tiny")  # the bundled model: a 6-layer Llama-style decoder trained on Python code
model, cfg = llm.model, llm.model.config
print(f"{cfg.num_hidden_layers} layers, {cfg.num_key_value_heads} kv heads of {cfg.head_dim} dims, "
      f"up to {cfg.max_position_embeddings} positions")

# %% [markdown]
# ## The concept: prefill, then decode
#
# Without a cache, producing token `t+1` runs the model over all `t` tokens again, although the keys
# and values of the first `t` positions have not changed (a token's K and V depend only on that
# token and the ones before it). With a cache:
#
# * **prefill** runs the whole prompt once, filling the cache: many tokens per weight read, so it
#   is compute-heavy and sets the **time to first token**;
# * **decode** runs only the newest token, attending over the cache: one token per weight read,
#   so it is memory-bound, and its per-step time is the **time per output token**.
#
# The count of token-positions the model processes makes the difference plain:

# %%
prompt_len, new_tokens = 64, 64
steps = torch.arange(1, new_tokens + 1)
fig = go.Figure([
    go.Scatter(x=steps, y=(prompt_len + steps - 1).cumsum(0), name="recompute every step"),
    go.Scatter(x=steps, y=prompt_len + steps - 1, name="KV cache: prefill once, then 1 per step"),
])
fig.update_layout(title=f"Tokens pushed through the model, {prompt_len}-token prompt",
                  xaxis_title="tokens generated", yaxis_title="token-positions processed (cumulative)", height=340)
fig.show()

# %% [markdown]
# ## Exercise 2.1 · A KV cache
#
# Your cache holds, for every layer, the keys and values of up to `max_len` positions of one
# sequence. `length` counts the positions already stored. When the model runs `n` new tokens, each
# layer calls `attend` once with their (already rotated) `k` and `v`: store them at positions
# `length .. length + n - 1`, then attend the `n` queries over positions `0 .. length + n - 1`.
# `attend` does not change `length`: all layers see the same `length` during one forward, and the
# caller advances it afterwards (exercise 2.2).
#
# `causal_attention(q, k, v)` (imported above) is `minillm`'s version of your lab 01 attention,
# offset mask included: queries are the last positions.

# %% exercise="2.1"
class KVCache(AttentionContext):
    """Keys and values of one sequence, for every layer.

    k, v: [num_layers, max_len, kv_heads, head_dim] (float32); length: positions stored so far.
    """

    def __init__(self, cfg: ModelConfig, max_len: int) -> None:
        """Allocate k and v for cfg.num_hidden_layers layers of max_len positions; length = 0.

        Hints: 3 lines. `torch.zeros`; shape from cfg.num_key_value_heads and cfg.head_dim.
        """
        ### BEGIN SOLUTION
        shape = (cfg.num_hidden_layers, max_len, cfg.num_key_value_heads, cfg.head_dim)
        self.k, self.v = torch.zeros(shape), torch.zeros(shape)
        self.length = 0
        ### END SOLUTION

    def attend(self, layer_idx: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Store this step's k, v, then attend q over everything cached for this layer.

        q: [n, heads, head_dim]; k, v: [n, kv_heads, head_dim] -> [n, heads, head_dim]
        Writes positions length .. length + n - 1 of layer `layer_idx`; raises ValueError if
        they do not fit in max_len (a cache of max_len holds positions 0 .. max_len - 1, the last
        one included). Leaves `length` unchanged.

        Hints: 6 lines. Slice assignment `self.k[layer_idx, start:end] = k`; `causal_attention`.
        """
        ### BEGIN SOLUTION
        start, end = self.length, self.length + q.shape[0]
        if end > self.k.shape[1]:
            raise ValueError(f"the cache holds {self.k.shape[1]} positions: {self.length} are stored, "
                             f"{q.shape[0]} more do not fit")
        self.k[layer_idx, start:end] = k
        self.v[layer_idx, start:end] = v
        return causal_attention(q, self.k[layer_idx, :end], self.v[layer_idx, :end])
        ### END SOLUTION


# %%
check("2.1")

# %% [markdown]
# ## Exercise 2.2 · One forward step on top of the cache
#
# The new tokens sit *after* everything cached, so their positions (which RoPE turns into
# rotations) start at `cache.length`, not at 0. Getting this wrong is one of the most common
# cache bugs: prefill still works, and every decoded token is quietly wrong.

# %% exercise="2.2"
def forward_step(model: torch.nn.Module, token_ids: Tensor, cache: KVCache) -> Tensor:
    """Run new tokens through the model on top of the cache, then advance the cache.

    token_ids: [n] -> logits [n, vocab]
    positions = cache.length .. cache.length + n - 1; hidden = model(token_ids, positions, cache);
    logits = model.compute_logits(hidden); cache.length += n

    Hints: 5 lines. `torch.arange(start, end)`; wrap the model call in `torch.no_grad()`.
    """
    ### BEGIN SOLUTION
    n = token_ids.shape[0]
    positions = torch.arange(cache.length, cache.length + n)
    with torch.no_grad():
        logits = model.compute_logits(model(token_ids, positions, cache))  # [n, vocab]
    cache.length += n
    return logits
    ### END SOLUTION


# %%
check("2.2")

# %% [markdown]
# ## Sampling: from scores to a token
#
# The last position's logits `z` define a distribution `softmax(z)`. Engines reshape it in a fixed
# order (the same in Hugging Face and vLLM):
#
# 1. **temperature** `T`: `softmax(z / T)`; `T < 1` sharpens, `T > 1` flattens, `T = 0` means greedy (argmax);
# 2. **top-k**: keep the `k` largest logits. Logits tied with the `k`-th largest all stay, so a
#    row may keep more than `k` (Hugging Face's `TopKLogitsWarper` does the same);
# 3. **top-p** (nucleus): keep the smallest set of most likely tokens whose probability reaches `p`.
#    The token that crosses `p` is kept, so the set is never empty;
# 4. renormalise and draw, from a `torch.Generator` seeded per request, so one request's samples do
#    not depend on anything else that runs.
#
# Filters set dropped logits to `-inf`, which `softmax` turns into probability 0. All functions
# work on a batch of rows, `[batch, vocab]`, each row on its own. They have the signatures of
# `minillm/sampling.py`: the engine will run your `sample` (which calls your filters) in place of
# its own.

# %% exercise="2.3"
def top_k_filter(logits: Tensor, k: int) -> Tensor:
    """Keep each row's k largest logits; set the others to -inf. k = 0 (or k >= vocab) keeps everything.

    logits: [batch, vocab] -> [batch, vocab]
    Keep z[b, j] if z[b, j] >= (k-th largest of row b), else -inf: every logit tied with the
    k-th largest stays.

    Hints: 3 lines. `torch.topk(logits, k, dim=-1).values[:, -1:]`, `masked_fill`.
    """
    ### BEGIN SOLUTION
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, k, dim=-1).values[:, -1:]  # [batch, 1]
    return logits.masked_fill(logits < kth, float("-inf"))
    ### END SOLUTION


# %%
check("2.3")

# %% exercise="2.4"
def top_p_filter(logits: Tensor, p: float) -> Tensor:
    """Keep each row's nucleus: its most likely tokens until their probability reaches p.

    logits: [batch, vocab] -> [batch, vocab]
    Sort each row's probabilities (softmax of its logits) in decreasing order; keep a token if
    the probability of the tokens before it is < p (so the token that reaches or crosses p stays,
    and the next one goes); set the rest to -inf. p >= 1 keeps all.

    Hints: 5 lines. `torch.sort(descending=True)`, `softmax`, `cumsum`, `scatter` (back to vocab order).
    """
    ### BEGIN SOLUTION
    if p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = sorted_logits.softmax(-1)
    before = probs.cumsum(-1) - probs  # [batch, vocab]: mass of the tokens ranked above
    drop = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, order, before >= p)
    return logits.masked_fill(drop, float("-inf"))
    ### END SOLUTION


# %%
check("2.4")

# %% [markdown]
# ## Exercise 2.5 · Drawing a token
#
# `sample` chains the steps above. The draw itself is spelled out, because it is part of the spec:
# one call `torch.multinomial(softmax(z), 1, generator=generator)` over the whole `[batch, vocab]`
# batch of filtered, tempered logits `z`, and no other use of the generator. With the same seed,
# your sampler then draws exactly the tokens `minillm`'s does, which is how the grader (and the
# engine check a few cells below) can compare them token for token. Other correct ways to sample
# (the Gumbel-max trick, `argmax(z + gumbel_noise)`, say) follow the same distribution but turn the
# generator's random numbers into other tokens, so here they do not pass.

# %% exercise="2.5"
def sample(logits: Tensor, temperature: float, top_k: int, top_p: float, generator: torch.Generator) -> Tensor:
    """Draw one token per row.

    logits: [batch, vocab] -> token ids [batch] (int64)
    temperature == 0: argmax of each row. Otherwise z = logits / temperature, then top_k_filter,
    then top_p_filter, then one token per row by exactly this call:
    torch.multinomial(softmax(z), 1, generator=generator). The engine draws so, and the same seed
    must give its tokens.

    Hints: 5 lines. `argmax(-1)`, `torch.multinomial(probs, 1, generator=generator)`.
    """
    ### BEGIN SOLUTION
    if temperature == 0:
        return logits.argmax(-1)
    z = top_p_filter(top_k_filter(logits / temperature, top_k), top_p)
    return torch.multinomial(z.softmax(-1), 1, generator=generator).squeeze(-1)
    ### END SOLUTION


# %%
check("2.5")

# %% [markdown]
# Here is what the filters do to a real next-token distribution of the bundled model:

# %%
ids = llm.tokenizer.encode("def add(a, b):\n    return")
last = llm.logits(ids)[-1:]  # [1, vocab]
top = last.topk(12).indices[0]
labels = [repr(llm.tokenizer.decode([t])) for t in top.tolist()]
settings = {"T=1": (1.0, 0, 1.0), "T=0.5": (0.5, 0, 1.0), "T=1, top-k 5": (1.0, 5, 1.0),
            "T=1, top-p 0.8": (1.0, 0, 0.8)}
fig = go.Figure([go.Bar(name=name, x=labels, y=top_p_filter(top_k_filter(last / t, k), p).softmax(-1)[0, top])
                 for name, (t, k, p) in settings.items()])
fig.update_layout(title="Next-token probabilities after each filter (12 most likely tokens)", barmode="group",
                  yaxis_title="probability", height=360)
fig.show()

# %% [markdown]
# ## Your sampler in the real engine
#
# `sample` has the signature of `minillm.sampling.sample`, so the engine can run yours in place of
# its own: `minillm.labkit.plug.plug("lab02_generation.ipynb")` builds such an engine. The check
# below runs a workload of greedy and sampled requests (temperature, top-k, top-p, each with its own
# seed) through the engine with your sampler, and compares every token with the engine's own.

# %%
check("2.E")

# %% [markdown]
# ## Exercise 2.6 · The generation loop
#
# Put it together: allocate a cache for the prompt plus the new tokens, **prefill** the prompt in
# one `forward_step`, sample from the last position's logits, then **decode**: feed back only the
# token you just sampled, one step at a time. Generate exactly `max_new_tokens` tokens (no stopping
# at end-of-text here; the engine handles stop conditions). The last token's logits are never
# used, so whether you also feed it back is up to you.
#
# Draw every token with one generator, seeded once: then your loop gives the engine's tokens for
# the same prompt and settings, `llm.generate(prompt, SamplingParams(..., seed=seed))`.

# %% exercise="2.6"
def generate(model: torch.nn.Module, prompt_ids: list[int], max_new_tokens: int,
             temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0) -> list[int]:
    """Generate max_new_tokens tokens after the prompt with a KV cache; -> the new token ids.

    One forward_step over the whole prompt (prefill), then one forward_step of one token per
    sampled token (decode). Draw every token with sample(...) and one torch.Generator seeded with `seed`.

    Hints: about 9 lines. `KVCache(model.config, len(prompt_ids) + max_new_tokens)`,
    `torch.tensor(ids)`, `logits[-1:]` keeps the batch dimension.
    """
    ### BEGIN SOLUTION
    cache = KVCache(model.config, len(prompt_ids) + max_new_tokens)
    generator = torch.Generator().manual_seed(seed)
    logits = forward_step(model, torch.tensor(prompt_ids), cache)[-1:]  # [1, vocab]
    out = []
    for _ in range(max_new_tokens):
        token = int(sample(logits, temperature, top_k, top_p, generator)[0])
        out.append(token)
        if len(out) < max_new_tokens:
            logits = forward_step(model, torch.tensor([token]), cache)
    return out
    ### END SOLUTION


# %%
check("2.6")

# %%
prompt_ids = llm.tokenizer.encode("class Stack:\n    def __init__(self):")
for seed in (0, 1):
    sampled = generate(model, prompt_ids, 20, temperature=0.8, top_p=0.95, seed=seed)
    print(f"seed {seed}:", repr(llm.tokenizer.decode(sampled)))
print("greedy:", repr(llm.tokenizer.decode(generate(model, prompt_ids, 20))))

# %% [markdown]
# ## Exercise 2.7 · TTFT and TPOT
#
# Serving systems report latency with two numbers (the definitions of vLLM's benchmark):
#
# * **TTFT**, time to first token = first token's time − the request's arrival time;
# * **TPOT**, time per output token = (last token's time − first token's time) / (tokens − 1),
#   the average gap once tokens flow; undefined (None) for a single token.

# %% exercise="2.7"
def latency_metrics(arrival: float, token_times: list[float]) -> tuple[float, float | None]:
    """TTFT and TPOT of one request, from its arrival time and each output token's time (seconds).

    -> (ttft, tpot); tpot is None when there is only one token.

    Hints: 3 lines.
    """
    ### BEGIN SOLUTION
    ttft = token_times[0] - arrival
    n = len(token_times)
    return ttft, (token_times[-1] - token_times[0]) / (n - 1) if n > 1 else None
    ### END SOLUTION


# %%
check("2.7")

# %% [markdown]
# ## Measure it
#
# **TTFT vs TPOT.** Time your generation loop step by step at growing prompt lengths. Prefill
# processes the whole prompt, so TTFT grows with it; a decode step processes one token, so TPOT
# barely moves (it grows only through attention over a longer cache).

# %%
def timed_generation(prompt_ids: list[int], new_tokens: int) -> tuple[float, float]:
    cache = KVCache(cfg, len(prompt_ids) + new_tokens)
    arrival = time.perf_counter()
    logits, times = forward_step(model, torch.tensor(prompt_ids), cache), []
    for _ in range(new_tokens):
        token = int(logits[-1].argmax())
        times.append(time.perf_counter())
        logits = forward_step(model, torch.tensor([token]), cache)
    return latency_metrics(arrival, times)


lengths = [16, 128, 256, 448]
timed_generation(list(range(1, 17)), 4)  # warm-up
ttfts, tpots = zip(*(timed_generation(torch.randint(1, cfg.vocab_size, (n,)).tolist(), 6) for n in lengths))
fig = go.Figure([go.Scatter(x=lengths, y=[t * 1e3 for t in ttfts], name="TTFT", mode="lines+markers"),
                 go.Scatter(x=lengths, y=[t * 1e3 for t in tpots], name="TPOT", mode="lines+markers")])
fig.update_layout(title="Latency of your generation loop", xaxis_title="prompt length (tokens)",
                  yaxis_title="ms", height=340)
fig.show()

out = llm.generate([torch.randint(1, cfg.vocab_size, (256,)).tolist()],
                   SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))[0]
print(f"minillm's engine, 256-token prompt: TTFT {out.metrics['ttft'] * 1e3:.1f} ms, "
      f"TPOT {out.metrics['tpot'] * 1e3:.1f} ms")

# %% [markdown]
# **What the cache buys.** At context length `c`, one new token costs either a cached decode step
# (one token through the weights, attention over `c` cached positions) or a full recompute (all
# `c + 1` tokens through everything). The ratio is the cache's speedup; watch how it grows with `c`.

# %%
def median_seconds(fn, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


contexts = [16, 64, 192, 448]
cached_ms, recompute_ms = [], []
for c in contexts:
    ids = torch.randint(1, cfg.vocab_size, (c + 1,))
    cache = KVCache(cfg, c + 1)
    forward_step(model, ids[:c], cache)

    def cached_step():
        cache.length = c  # rewrite position c each time: one decode step at context c
        forward_step(model, ids[c:], cache)
    cached_ms.append(median_seconds(cached_step) * 1e3)
    recompute_ms.append(median_seconds(lambda: llm.logits(ids)) * 1e3)
speedup = [r / m for r, m in zip(recompute_ms, cached_ms)]
fig = go.Figure(go.Scatter(x=contexts, y=speedup, mode="lines+markers", name="recompute / cached"))
fig.update_layout(title="KV cache speedup for one new token", xaxis_title="context length (tokens)",
                  yaxis_title="speedup (×)", height=340)
fig.show()
print("context  cached ms  recompute ms  speedup")
for c, a, b, s in zip(contexts, cached_ms, recompute_ms, speedup):
    print(f"{c:7d}  {a:9.2f}  {b:12.2f}  {s:6.1f}x")

# %% [markdown]
# The speedup grows with the context: recompute does `c + 1` tokens of work per step, the cached
# step about one (plus attention over `c` positions, which is small for this model at these
# lengths). Over a whole generation, recompute is quadratic in the sequence length and
# the cache makes it linear. The price is memory: `2 × layers × kv_heads × head_dim × bytes` per
# token, held for the request's whole life. That memory, not compute, is what limits how many
# requests a server can run at once; labs 03 and 04 are about spending it well.
#
# ## On a real model
#
# `tiny` is so small that a decode step costs mostly fixed overheads. A real model changes what
# each side of the ratio is made of. SmolLM2-135M-Instruct has 540 MB of float32 weights (30
# layers, 3 kv heads of 64 dims):
#
# * a **cached step** runs one token, so it reads every weight for a single multiply-add each: it
#   is weight-bound, and costs about "weight bytes / bandwidth" whatever the context, plus
#   attention over the `c` cached positions;
# * a **recompute** runs all `c + 1` tokens as one prefill: each weight read serves `c + 1` tokens,
#   so it is compute-bound, and its time grows in proportion to `c`.
#
# So the speedup grows with `c`, but stays well below `c + 1`: recompute does `c + 1` tokens of
# work, yet at matmul efficiency, while the cached step pays the whole weight read for one token.
# The cell below measures both with your `KVCache` and `forward_step`, at a few context lengths.
# Recompute here projects only the last position to the vocabulary, as a cache-free generator
# would. It runs torch on one thread: on a shared CPU, a second thread mostly waits for a core
# in the small operators of a decode step. The recomputes take a few seconds each, and a busy
# machine adds noise, so read the shape. If the model is not installed, the cell says how to
# install it and skips.

# %%
from minillm.labkit import REAL_MODEL, real_model_installed

if real_model_installed():
    torch.set_num_threads(1)
    real_model = LLM(REAL_MODEL).model
    real_cfg = real_model.config
    real_contexts = [64, 128, 256, 512]
    real_cached_ms, real_recompute_ms = [], []
    for c in real_contexts:
        ids = torch.randint(1, real_cfg.vocab_size, (c + 1,))
        real_cache = KVCache(real_cfg, c + 1)
        forward_step(real_model, ids[:c], real_cache)  # prefill the context once

        def real_cached_step():
            real_cache.length = c  # rewrite position c each time: one decode step at context c
            forward_step(real_model, ids[c:], real_cache)

        def real_recompute():
            with torch.no_grad():
                real_model.compute_logits(real_model(ids, torch.arange(c + 1))[-1:])
        real_cached_ms.append(median_seconds(real_cached_step) * 1e3)
        real_recompute_ms.append(median_seconds(real_recompute, repeats=1) * 1e3)
    real_speedup = [r / m for r, m in zip(real_recompute_ms, real_cached_ms)]
    fig = go.Figure([go.Scatter(x=real_contexts, y=real_speedup, mode="lines+markers", name=REAL_MODEL),
                     go.Scatter(x=contexts, y=speedup, mode="lines+markers", name="tiny (measured above)"),
                     go.Scatter(x=real_contexts, y=[c + 1 for c in real_contexts], mode="lines",
                                line_dash="dot", name="c + 1 (tokens recomputed)")])
    fig.update_layout(title="KV cache speedup for one new token, on a real model", yaxis_type="log",
                      xaxis_title="context length c (tokens)", yaxis_title="speedup (×)", height=360)
    fig.show()
    print(f"{REAL_MODEL}: context  cached ms  recompute ms  speedup")
    for c, a, b, s in zip(real_contexts, real_cached_ms, real_recompute_ms, real_speedup):
        print(f"{c:30d}  {a:9.1f}  {b:12.1f}  {s:6.1f}x")
    del real_model, real_cache

# %% [markdown]
# Read the cached column first: on this model it does not grow with the context (its ups and downs
# are a shared machine's noise), since the weights, not the 3 × 64-wide keys and values, are most of
# what a step reads: at 512 positions the cache of all 30 layers is 24 MB, beside 540 MB of weights.
# The recompute column grows with the context, so the speedup does too (apart from noise), staying
# below the dotted `c + 1` line: a prefill's large matmuls do a token's arithmetic far faster than a
# decode step streams the weights. Both effects are what a GPU serving a large model shows, where
# decode is weight-bound too.
#
# ## How production engines do it
#
# * **Paged KV cache.** vLLM's PagedAttention stores the cache in fixed-size blocks with a block
#   table per sequence instead of one contiguous `max_len` slab per request (which is what you
#   built, and what `minillm/cache/contiguous.py` does). SGLang's RadixAttention and TensorRT-LLM's
#   paged KV cache manager do the same, and share blocks between requests with a common prefix. Lab 03.
# * **Prefill and decode in one batch.** Engines schedule many requests' decode steps together and
#   split long prompts into chunks ("chunked prefill") so a long prefill does not stall everyone's
#   TPOT. TensorRT-LLM calls the batching "in-flight batching"; vLLM and SGLang "continuous batching". Lab 04.
# * **Sampling on the GPU.** vLLM's sampler applies temperature, top-k and top-p to the whole batch
#   at once, and can use FlashInfer's sorting-free top-k/top-p kernels; each request still carries
#   its own seed, as yours does.
# * **TTFT and TPOT as SLOs.** Deployments set targets for both (say TTFT < 500 ms, TPOT < 50 ms) and
#   measure *goodput*: requests per second that meet them (coming in lab 08).
