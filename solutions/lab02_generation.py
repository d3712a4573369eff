# %% [markdown]
# # Lab 02 · Generation and the KV cache
#
# **Time:** about 105 minutes in all, stated per section below. **You need:** lab 01 (attention with an
# offset causal mask) and lab 00 (the roofline: a kernel's time is bounded by its FLOPs and by its bytes).
#
# A model gives scores for the *next* token. Generating text means calling it again and again, one
# token at a time. Done naively, every call recomputes the whole sequence; an inference engine
# instead keeps each layer's keys and values (the **KV cache**), so a new token costs one token's
# work. In this lab you build that cache, the generation loop around it, and the sampler that turns
# scores into tokens, then you predict, and measure on a real model, what the cache buys.
#
# **See it run:** the visualizer's **Live engine** page (`make app`) streams requests through the engine and
# shows each one's time to first token and inter-token latency as it decodes. **Read more**, after the lab:
# `docs/engine.md`, its sections "One step, in three parts" (where prefill, decode and the sampler sit in a step)
# and "The KV cache".
#
# ## Learning objectives
# By the end you can
# 1. tell **prefill** (the prompt, many tokens at once) from **decode** (one token per step) and say
#    why their costs differ;
# 2. write a KV cache that plugs into a real engine's model, with the positions right;
# 3. implement greedy, temperature, top-k and top-p sampling, reproducibly seeded;
# 4. define and measure **TTFT** (time to first token) and **TPOT** (time per output token);
# 5. predict the cache's speedup over recomputation from the FLOP and byte counts, then measure it on
#    SmolLM2-135M at growing context and explain the gap.
#
# ## How this lab works
# Write code only in the exercise cells (they contain `raise NotImplementedError`), keeping names
# and signatures. Run each `check(...)` cell for feedback; `make grade LAB=02` grades the notebook.
# Each exercise is followed by hints in collapsed blocks: open them one at a time, only when stuck.
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

from minillm import LLM

llm = LLM("tiny")  # the bundled model: a 6-layer Llama-style decoder trained on Python code
model, cfg = llm.model, llm.model.config
print(f"{cfg.num_hidden_layers} layers, {cfg.num_key_value_heads} kv heads of {cfg.head_dim} dims, "
      f"up to {cfg.max_position_embeddings} positions")

# %% [markdown]
# ## The concept: prefill, then decode (~5 min)
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
# ## Exercise 2.1 · A KV cache (~10 min)
#
# Your cache holds, for every layer, the keys and values of up to `max_len` positions of one
# sequence. `length` counts the positions already stored. When the model runs `n` new tokens, each
# layer calls `attend` once with their (already rotated) `k` and `v`. The cache has two jobs in that
# call: keep the new keys and values *after* the ones it already holds, and let the new queries
# attend over everything held so far, old and new. Say 5 positions are stored and 2 arrive: they
# become positions 5 and 6, and the two queries see keys 0 to 6 (the causal mask hides key 6 from
# query 5).
#
# `attend` does not change `length`: all layers see the same `length` during one forward, and the
# caller advances it afterwards (exercise 2.2).
#
# `causal_attention(q, k, v)` (imported above) is `minillm`'s version of your lab 01 attention,
# offset mask included: queries are the last positions of the keys it is given.

# %% exercise="2.1"
class KVCache(AttentionContext):
    """Keys and values of one sequence, for every layer.

    k, v: [num_layers, max_len, kv_heads, head_dim] (float32); length: positions stored so far.
    """

    def __init__(self, cfg: ModelConfig, max_len: int) -> None:
        """Allocate zeroed float32 k and v for cfg.num_hidden_layers layers, max_len positions each,
        cfg.num_key_value_heads heads of cfg.head_dim; length starts at 0.
        """
        ### BEGIN SOLUTION
        shape = (cfg.num_hidden_layers, max_len, cfg.num_key_value_heads, cfg.head_dim)
        self.k, self.v = torch.zeros(shape), torch.zeros(shape)
        self.length = 0
        ### END SOLUTION

    def attend(self, layer_idx: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Store this step's k, v for layer `layer_idx`, then attend q over everything this layer holds.

        q: [n, heads, head_dim]; k, v: [n, kv_heads, head_dim] -> [n, heads, head_dim]
        The n new positions follow the `length` already stored. Raises ValueError (and writes nothing)
        when they do not fit: a cache of max_len holds positions 0 to max_len - 1, the last one
        included. Leaves `length` unchanged, and other layers' entries untouched.
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


# %% [markdown]
# <details><summary>Hint 1: a nudge</summary>
#
# Which rows of `self.k[layer_idx]` are "already stored", and which rows do the `n` new keys take?
# Then: which rows should the queries see?
#
# </details>
# <details><summary>Hint 2: the idea</summary>
#
# Write the new keys and values into a slice of this layer's tensors that starts at `length`; attend over
# the slice from row 0 to the end of what you just wrote. Check the end against the tensor's size first.
#
# </details>
# <details><summary>Hint 3: the last resort</summary>
#
# With `start = length` and `end = length + n`: rows `start:end` take the new k and v, and the queries
# attend over rows `:end`. `end > max_len` is the error case.
#
# </details>

# %%
check("2.1")

# %% [markdown]
# ## Exercise 2.2 · One forward step on top of the cache (~5 min)
#
# The new tokens sit *after* everything cached, and their positions, which RoPE turns into
# rotations, must say so. With 5 tokens cached, a chunk of 3 new ones is at positions 5, 6 and 7, not
# 0, 1 and 2. Getting this wrong is one of the most common cache bugs: prefill still works, and every
# decoded token is quietly wrong.

# %% exercise="2.2"
def forward_step(model: torch.nn.Module, token_ids: Tensor, cache: KVCache) -> Tensor:
    """Run new tokens through the model on top of the cache, then advance the cache.

    token_ids: [n] int64, the tokens that follow the cache's `length` stored ones
    -> logits [n, vocab] float32, row i the scores for the token after token_ids[i].
    Afterwards cache.length counts the n new tokens too. No autograd graph is kept.
    """
    ### BEGIN SOLUTION
    n = token_ids.shape[0]
    positions = torch.arange(cache.length, cache.length + n)
    with torch.no_grad():
        logits = model.compute_logits(model(token_ids, positions, cache))  # [n, vocab]
    cache.length += n
    return logits
    ### END SOLUTION


# %% [markdown]
# <details><summary>Hint 1: a nudge</summary>
#
# The model's forward takes the tokens, their positions and the attention context (your cache). Which
# positions do the new tokens have, given what the cache already holds?
#
# </details>
# <details><summary>Hint 2: the idea</summary>
#
# Build the positions from `cache.length` onwards, run the model and its vocabulary projection without
# gradients, and only then move `cache.length` on: every layer must see the old length during the forward.
#
# </details>

# %%
check("2.2")

# %% [markdown]
# ## Sampling: from scores to a token (~5 min)
#
# The last position's logits `z` define a distribution `softmax(z)`. Engines reshape it in a fixed
# order (the same in Hugging Face and vLLM): **temperature**, then **top-k**, then **top-p**, then a
# draw. You write the two filters first (2.3, 2.4), then the sampler that chains them (2.5).
#
# **Temperature** `T` rescales the logits before the softmax. With logits `[2, 0]`: at `T = 1` the two
# tokens get 0.88 and 0.12; at `T = 0.5` they get 0.98 and 0.02 (sharper); at `T = 2`, 0.73 and 0.27
# (flatter). Work out for yourself what `T` does to the logits to give these numbers. `T = 0` means
# greedy: the most likely token, no randomness.
#
# Filters set dropped logits to `-inf`, which `softmax` turns into probability 0. All functions
# work on a batch of rows, `[batch, vocab]`, each row on its own. They have the signatures of
# `minillm/sampling.py`: the engine will run your `sample` (which calls your filters) in place of
# its own.
#
# ## Exercise 2.3 · Top-k (~10 min)
#
# **Top-k** keeps each row's `k` most likely tokens. Softmax keeps the order of the logits, so "most
# likely" can be decided on the logits themselves. Ties need a rule: logits equal to the `k`-th
# largest all stay, so a row may keep more than `k` (Hugging Face's `TopKLogitsWarper` does the
# same). A worked example with `k = 3` on the row `[1.0, 4.0, 2.5, 4.0, 2.5, 0.5]`: sorted, it reads
# `4.0, 4.0, 2.5, 2.5, 1.0, 0.5`; the third largest is 2.5, and both 2.5s tie with it, so four tokens
# stay and the row becomes `[-inf, 4.0, 2.5, 4.0, 2.5, -inf]`.

# %% exercise="2.3"
def top_k_filter(logits: Tensor, k: int) -> Tensor:
    """Keep each row's k largest logits; set the others to -inf.

    logits: [batch, vocab] float -> [batch, vocab], same dtype; every row on its own.
    Logits tied with the smallest one kept stay too, so a row may keep more than k.
    k = 0, or k at least the vocabulary size, keeps everything. The input is not modified.
    """
    ### BEGIN SOLUTION
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, k, dim=-1).values[:, -1:]  # [batch, 1]
    return logits.masked_fill(logits < kth, float("-inf"))
    ### END SOLUTION


# %% [markdown]
# <details><summary>Hint 1: a nudge</summary>
#
# You do not need to know *which* tokens are the top k, only the value a logit must reach to stay.
#
# </details>
# <details><summary>Hint 2: the idea</summary>
#
# Find each row's k-th largest value (a threshold, one per row, kept as a column so that it broadcasts
# over the row), then replace every logit below its row's threshold by `-inf`. "Below", not "at most":
# that keeps the ties.
#
# </details>

# %%
check("2.3")

# %% [markdown]
# ## Exercise 2.4 · Top-p, the nucleus (~15 min)
#
# **Top-p** keeps the smallest set of most likely tokens whose probability reaches `p`. The token that
# crosses `p` is kept, so the set is never empty. A worked example with `p = 0.7` on probabilities
# `[0.1, 0.45, 0.05, 0.3, 0.1]`: in decreasing order they are 0.45, 0.3, 0.1, 0.1, 0.05. After 0.45
# alone the mass is 0.45, short of 0.7; the 0.3 brings it to 0.75, past 0.7, so the 0.3 stays and
# everything after it goes: two tokens are kept. Had `p` been exactly 0.75, the same two would stay
# (the mass *reaches* `p`). Note what the example decided for each token: whether the tokens ranked
# *above* it had already reached `p`.
#
# The answer must come back in the row's original (vocabulary) order, not the sorted one.

# %% exercise="2.4"
def top_p_filter(logits: Tensor, p: float) -> Tensor:
    """Keep each row's nucleus: the fewest most likely tokens whose probability (the row's softmax)
    reaches p; set the rest to -inf.

    logits: [batch, vocab] float -> [batch, vocab], same dtype, in vocabulary order; every row on its own.
    The token that reaches or crosses p stays, so at least one token stays. p >= 1 keeps everything.
    The input is not modified.
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


# %% [markdown]
# <details><summary>Hint 1: a nudge</summary>
#
# The decision needs the tokens in decreasing order of probability, and a running total of their mass.
#
# </details>
# <details><summary>Hint 2: the idea</summary>
#
# Sort each row (remembering where each sorted entry came from), take the softmax of the sorted logits
# and a running sum. A token goes when the mass of the tokens *before* it has already reached `p`:
# that is the running sum minus the token's own probability. Then carry the keep/drop decisions back
# to vocabulary order with the remembered indices.
#
# </details>
# <details><summary>Hint 3: the last resort</summary>
#
# drop (in sorted order) = (running sum - own probability) >= p. Scatter that mask through the sort's
# indices into a mask in vocabulary order, and fill those logits with `-inf`.
#
# </details>

# %%
check("2.4")

# %% [markdown]
# ## Exercise 2.5 · Drawing a token (~10 min)
#
# `sample` chains the steps above in the engine's order. The draw itself is part of the spec, because
# the engine's tokens are compared with yours token for token: one call of
# `torch.multinomial(probabilities, 1, generator=generator)` over the whole `[batch, vocab]` batch of
# probabilities (the softmax of the tempered, filtered logits), and no other use of the generator.
# With the same seed your sampler then draws exactly the tokens `minillm`'s does. Other correct ways
# to sample (the Gumbel-max trick, `argmax(z + gumbel_noise)`, say) follow the same distribution but
# turn the generator's random numbers into other tokens, so here they do not pass.

# %% exercise="2.5"
def sample(logits: Tensor, temperature: float, top_k: int, top_p: float, generator: torch.Generator) -> Tensor:
    """Draw one token per row, as the engine's sampler does.

    logits: [batch, vocab] float; temperature >= 0 (0 is greedy: no randomness, the generator unused);
    top_k >= 0 (0 keeps all); 0 < top_p <= 1 (1 keeps all). -> token ids [batch] int64.
    Temperature, top-k and top-p apply in the order of the section above; the draw is the engine's
    single multinomial draw over the batch with `generator` (described above), so that the same seed
    gives the engine's tokens. The input is not modified.
    """
    ### BEGIN SOLUTION
    if temperature == 0:
        return logits.argmax(-1)
    z = top_p_filter(top_k_filter(logits / temperature, top_k), top_p)
    return torch.multinomial(z.softmax(-1), 1, generator=generator).squeeze(-1)
    ### END SOLUTION


# %% [markdown]
# <details><summary>Hint 1: a nudge</summary>
#
# Handle greedy first: it is the one case that draws nothing. Then, what does the worked example of
# temperature tell you to do to the logits before the filters see them?
#
# </details>
# <details><summary>Hint 2: the idea</summary>
#
# Rescale by the temperature, filter with your top-k, then your top-p, turn the result into
# probabilities and make the one draw. The draw gives a `[batch, 1]` answer: the contract wants `[batch]`.
#
# </details>

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
# ## Your sampler in the real engine (~2 min)
#
# `sample` has the signature of `minillm.sampling.sample`, so the engine can run yours in place of
# its own: `minillm.labkit.plug.plug("lab02_generation.ipynb")` builds such an engine. The check
# below runs a workload of greedy and sampled requests (temperature, top-k, top-p, each with its own
# seed) through the engine with your sampler, and compares every token with the engine's own.

# %%
check("2.E")

# %% [markdown]
# ## Exercise 2.6 · The generation loop (~10 min)
#
# Put it together: a cache big enough for the prompt and the answer, the prompt's **prefill** in one
# step, then **decode**, one token at a time, each step feeding back only the token just drawn.
# Generate exactly `max_new_tokens` tokens (no stopping at end-of-text here; the engine handles stop
# conditions). The last token's logits are never used, so whether you also feed it back is up to you.
#
# Draw every token with one generator, seeded once: then your loop gives the engine's tokens for
# the same prompt and settings, `llm.generate(prompt, SamplingParams(..., seed=seed))`.

# %% exercise="2.6"
def generate(model: torch.nn.Module, prompt_ids: list[int], max_new_tokens: int,
             temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0) -> list[int]:
    """Generate max_new_tokens tokens after the prompt with a KV cache; -> the new token ids.

    prompt_ids: at least one token id; max_new_tokens >= 1. The prompt is run once, as one prefill;
    every later model call runs one token. Sampling settings as in sample(); one generator seeded
    with `seed` draws every token, so the engine's tokens come out for the same prompt and settings.
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


# %% [markdown]
# <details><summary>Hint 1: a nudge</summary>
#
# How many positions must the cache hold by the end? Which logits row do you sample the next token from?
#
# </details>
# <details><summary>Hint 2: the idea</summary>
#
# Make the cache and the generator once, before the loop. Prefill gives one logits row per prompt token:
# only the last row matters, kept as a batch of one for `sample`. In the loop: draw, record, and run the
# drawn token alone through `forward_step` to get the next row.
#
# </details>

# %%
check("2.6")

# %%
prompt_ids = llm.tokenizer.encode("class Stack:\n    def __init__(self):")
for seed in (0, 1):
    sampled = generate(model, prompt_ids, 20, temperature=0.8, top_p=0.95, seed=seed)
    print(f"seed {seed}:", repr(llm.tokenizer.decode(sampled)))
print("greedy:", repr(llm.tokenizer.decode(generate(model, prompt_ids, 20))))

# %% [markdown]
# ## Exercise 2.7 · TTFT and TPOT (~5 min)
#
# Serving systems report latency with two numbers (the definitions of vLLM's benchmark):
#
# * **TTFT**, time to first token: how long the request waited, from its arrival, for its first token;
# * **TPOT**, time per output token: the average gap between consecutive tokens once they flow (the
#   first token's wait is TTFT's, not TPOT's); it is undefined (None) for a single token.
#
# A worked example: a request arrives at t = 10.0 s and its tokens come at 10.5, 10.6, 10.8 and 10.9 s.
# Its TTFT is 0.5 s; its tokens flowed for 0.4 s over 3 gaps, so its TPOT is about 0.133 s.

# %% exercise="2.7"
def latency_metrics(arrival: float, token_times: list[float]) -> tuple[float, float | None]:
    """TTFT and TPOT of one request, from its arrival time and each output token's time (seconds).

    token_times: at least one time, in order. -> (ttft, tpot) in seconds; tpot is None for one token.
    """
    ### BEGIN SOLUTION
    ttft = token_times[0] - arrival
    n = len(token_times)
    return ttft, (token_times[-1] - token_times[0]) / (n - 1) if n > 1 else None
    ### END SOLUTION


# %%
check("2.7")

# %% [markdown]
# ## Predict: what the cache buys on a real model (~10 min)
#
# The main experiment runs on SmolLM2-135M-Instruct, a real instruct model (30 layers, 3 kv heads of 64
# dims; the next cell prints its sizes). At context length `c`, one new token costs either
#
# * a **cached step**: one token through every weight, plus its attention over the `c` cached positions; or
# * a **recompute**: all `c + 1` tokens through every weight (a prefill), plus causal attention among them.
#   Only the last position needs the vocabulary projection, as a cache-free generator would do.
#
# **The FLOP count.** A matrix-vector product with a `m × n` weight costs `2mn` FLOPs: a token passing
# through `N` weights costs about `2N`. Attention costs, per layer and per (query, key) pair, two dot
# products of the query heads' width (scores, then the weighted sum of values). Count both sides at
# `c`, and you have the ratio of their *work*. Ask yourself how it grows with `c`: per new token,
# recompute is O(c) and the cache is O(1) (plus attention, O(c) but small); over a whole generation of
# `n` tokens that is O(n²) against O(n).
#
# **The time.** Lab 00's roofline says a step takes at least `max(FLOPs / peak, bytes / bandwidth)`. A
# cached step does a few FLOPs per weight byte it reads; a recompute does `c + 1` times as many. Which
# side of the roofline is each on? That decides whether the measured speedup comes near the FLOP ratio.
#
# Write down your prediction of the speedup (recompute time / cached-step time) at the longest context
# the next cell prints, from the FLOP counts, and better, from lab 00's roofline with this machine's
# figures (the next cell measures them, as lab 00 did).

# %%
from minillm.labkit import REAL_MODEL, compare, quick_run, real_model_installed
from minillm.perf import measure_bandwidth, measure_flops

torch.set_num_threads(1)  # decode steps are small operators: on a shared CPU a second thread mostly waits
have_real = real_model_installed()
if have_real:
    real_model = LLM(REAL_MODEL).model
    real_cfg = real_model.config
    real_contexts = [64, 256] if quick_run() else [64, 128, 256, 512, 1024]
    n_params = sum(p.numel() for p in real_model.parameters())
    lm_head = real_cfg.vocab_size * real_cfg.hidden_size  # the (tied) vocabulary projection
    print(f"{REAL_MODEL}: {n_params / 1e6:.1f}M parameters ({n_params * 4 / 1e6:.0f} MB in float32), "
          f"{real_cfg.num_hidden_layers} layers, {real_cfg.num_attention_heads} query heads and "
          f"{real_cfg.num_key_value_heads} kv heads of {real_cfg.head_dim} dims, a vocabulary of {real_cfg.vocab_size} "
          f"({lm_head / 1e6:.1f}M of the parameters)")
    peak, bandwidth = measure_flops(torch.device("cpu"), torch.float32), measure_bandwidth(torch.device("cpu"))
    print(f"this machine, one thread: {peak / 1e9:.1f} GFLOP/s (float32 matmul), {bandwidth / 1e9:.1f} GB/s")
    print(f"contexts measured: {real_contexts}; predict the speedup at c = {real_contexts[-1]}")

# %%
MY_PREDICTION = None  # ×: recompute time / cached-step time at the longest context above, from the counts

# %% [markdown]
# ## Measure: the KV cache against recompute (~10 min)
#
# The cell below times one new token both ways with your `KVCache` and `forward_step`, at each context
# length, and computes two theory lines: the FLOP ratio, and the roofline ratio (each side's
# `max(FLOPs / peak, bytes / bandwidth)` with the figures measured above). The recomputes take seconds
# each at the longest contexts; a busy machine adds noise, so read the shape.

# %%
def median_seconds(fn, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def step_cost(c: int, recompute: bool) -> tuple[float, float]:
    """(FLOPs, bytes) of one new token at context c: recomputed from scratch, or one cached decode step."""
    body = n_params - lm_head  # the weights every token passes through, besides the vocabulary projection
    width = real_cfg.num_attention_heads * real_cfg.head_dim
    tokens = c + 1 if recompute else 1
    pairs = (c + 1) * (c + 2) // 2 if recompute else c + 1  # (query, key) pairs under the causal mask
    flops = 2 * body * tokens + 2 * 2 * width * pairs * real_cfg.num_hidden_layers + 2 * lm_head
    kv = 0 if recompute else 2 * real_cfg.num_hidden_layers * real_cfg.num_key_value_heads * real_cfg.head_dim * c * 4
    return flops, n_params * 4 + kv


def roofline(cost: tuple[float, float]) -> float:
    return max(cost[0] / peak, cost[1] / bandwidth)


if have_real:
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
        real_cached_ms.append(median_seconds(real_cached_step, repeats=3 if quick_run() else 7) * 1e3)
        real_recompute_ms.append(median_seconds(real_recompute, repeats=1 if quick_run() or c > 256 else 3) * 1e3)
    real_speedup = [r / m for r, m in zip(real_recompute_ms, real_cached_ms)]
    flop_ratio = [step_cost(c, True)[0] / step_cost(c, False)[0] for c in real_contexts]
    roofline_ratio = [roofline(step_cost(c, True)) / roofline(step_cost(c, False)) for c in real_contexts]
    fig = go.Figure([go.Scatter(x=real_contexts, y=real_speedup, mode="lines+markers", name="measured"),
                     go.Scatter(x=real_contexts, y=flop_ratio, mode="lines", line_dash="dot",
                                name="FLOP ratio (O(c): the work)"),
                     go.Scatter(x=real_contexts, y=roofline_ratio, mode="lines", line_dash="dash",
                                name="roofline ratio (this machine)")])
    fig.update_layout(title=f"KV cache speedup for one new token, {REAL_MODEL}", yaxis_type="log",
                      xaxis_title="context length c (tokens)", yaxis_title="recompute / cached (×)", height=360)
    fig.show()
    print("context  cached ms (bound)  recompute ms (bound)  speedup  FLOP ratio  roofline ratio")
    for i, c in enumerate(real_contexts):
        print(f"{c:7d}  {real_cached_ms[i]:9.1f} ({roofline(step_cost(c, False)) * 1e3:5.1f})"
              f"  {real_recompute_ms[i]:12.1f} ({roofline(step_cost(c, True)) * 1e3:6.1f})"
              f"  {real_speedup[i]:6.1f}x  {flop_ratio[i]:9.1f}x  {roofline_ratio[i]:13.1f}x")
    compare(f"KV cache speedup at context {real_contexts[-1]}", MY_PREDICTION, theory=roofline_ratio[-1],
            measured=real_speedup[-1], unit="×", theory_name="roofline ratio",
            gap=f"the FLOP ratio ({flop_ratio[-1]:.0f}x) counts work only; the cached step pays a whole weight "
                "read for one token, so both sides are charged their roofline time, and what is left between it "
                "and the measurement is each side's distance from its own bound (the bound columns above).")

# %% [markdown]
# Read the table's bound columns first. The cached step's bound is its weight read: it hardly moves with
# the context, because the weights, not the 3 × 64-wide keys and values, are most of what it reads (the
# next cell prints how big the cache is beside them). The recompute's bound is its arithmetic, which grows
# with `c`. So the speedup grows with the context, but stays far below the FLOP ratio: a prefill's large
# matmuls do a token's arithmetic far faster than a decode step streams the weights. A GPU serving a large
# model shows the same: decode is weight-bound there too.
#
# ## Measure: TTFT and TPOT beside their bounds (~5 min)
#
# Your generation loop, timed token by token on the real model. Prefill processes the whole prompt, so
# TTFT grows with it, bounded below by the prompt's FLOPs over the peak; a decode step processes one token,
# so TPOT is bounded below by the weight read over the bandwidth, whatever the prompt.

# %%
def timed_generation(m: torch.nn.Module, prompt_ids: list[int], new_tokens: int) -> tuple[float, float]:
    cache = KVCache(m.config, len(prompt_ids) + new_tokens)
    arrival = time.perf_counter()
    logits, times = forward_step(m, torch.tensor(prompt_ids), cache), []
    for _ in range(new_tokens):
        token = int(logits[-1].argmax())
        times.append(time.perf_counter())
        logits = forward_step(m, torch.tensor([token]), cache)
    return latency_metrics(arrival, times)


if have_real:
    prompt_lengths = [32, 256] if quick_run() else [32, 128, 256, 512]
    print("prompt  TTFT ms (bound)   TPOT ms (bound)")
    for n in prompt_lengths:
        ttft, tpot = timed_generation(real_model, torch.randint(1, real_cfg.vocab_size, (n,)).tolist(), 6)
        ttft_bound = roofline(step_cost(n - 1, True))  # a prefill of n tokens is a "recompute" at context n - 1
        tpot_bound = roofline(step_cost(n, False))
        print(f"{n:6d}  {ttft * 1e3:7.1f} ({ttft_bound * 1e3:6.1f})  {tpot * 1e3:7.1f} ({tpot_bound * 1e3:5.1f})")
    kv_bytes = 2 * real_cfg.num_hidden_layers * real_cfg.num_key_value_heads * real_cfg.head_dim * 4
    print(f"the KV cache costs {kv_bytes / 1e3:.0f} kB per token in float32: "
          f"{kv_bytes * real_contexts[-1] / 1e6:.1f} MB at {real_contexts[-1]} tokens, "
          f"beside {n_params * 4 / 1e6:.0f} MB of weights")
    del real_model, real_cache

# %% [markdown]
# The cache turns a quadratic generation into a linear one. The price is memory: the per-token figure
# printed above, held for the request's whole life and multiplied by every request a server runs at
# once. That memory, not compute, is what limits how many requests fit; labs 03 and 04 are about
# spending it well.
#
# ## How production engines do it (~5 min)
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
# * **TTFT and TPOT as SLOs.** Deployments set targets for both and measure *goodput*: requests per
#   second that meet them (coming in lab 08).
