# %% [markdown]
# # Lab 05 · Speculative decoding
#
# **Time:** about 140 minutes in all; each section's heading gives its share. **You need:** lab 02
# (temperature, top-k and top-p sampling) and lab 04 (what a step computes); lab 00's roofline
# explains why any of this works.
#
# **See it run:** the visualizer's **Speculative decoding** page (`make app`) shows each step's
# proposals, acceptance and tokens per forward against k, and the proposers side by side; it can
# run on your notebook's parts. **Read more:**
# [docs/engine.md, "Speculative decoding"](../docs/engine.md#speculative-decoding).
#
# A decode step reads every weight of the model to produce **one** token per sequence. On a GPU
# that read, not the arithmetic, sets the step's time (lab 00): computing five tokens in a forward
# costs hardly more than computing one. **Speculative decoding** spends that idle arithmetic. A
# cheap **proposer** guesses the next k tokens; the model we actually want to run, the **target**,
# scores all k guesses in a single forward and keeps those it agrees with, plus one token of its
# own. One forward, between 1 and k + 1 tokens.
#
# Done right, nothing about the output changes: greedy tokens are identical, and sampled tokens
# are distributed *exactly* as the target's own samples. Done wrong, the model quietly becomes a
# different model, and no benchmark of speed will tell you. So this lab is half probability and
# half engineering: you write the rejection rule that keeps sampling exact, the verifier, the
# prompt-lookup proposer and the multi-token-prediction heads' proposal that plug into `minillm`,
# the formula that predicts what a proposer buys, and the loss that trains a draft model to agree
# with its target; then you train a draft with it. You measure when speculation pays, and when it
# does not, on a real model.
#
# ## Learning objectives
# By the end you can
# 1. say what one speculative step computes (k proposals + 1 positions) and what it emits;
# 2. prove, and implement, the rejection rule that keeps sampled output distributed as the target's;
# 3. verify proposals greedily and by sampling, with the correction and the bonus token;
# 4. propose tokens by prompt lookup, with no model at all;
# 5. predict tokens per forward from the acceptance rate α and k, and check it against the engine;
# 6. measure the speedup, and find where speculation stops paying: low acceptance, big batches;
# 7. write the distillation loss, distill a draft with it and measure its acceptance rate rise;
# 8. propose from multi-token-prediction heads on the target's own hidden state.
#
# ## How this lab works
# Write code only in the exercise cells (they contain `raise NotImplementedError`), keeping names
# and signatures. Run each `check(...)` cell for feedback. `make grade LAB=05` grades the notebook,
# and like `check("5.E")` near the end it runs your verifier and your proposer **inside the real
# engine** and compares the tokens it generates with those of the engine's own.
# `minillm/speculative/` holds the engine's version (`verify.py`, `ngram.py`, `theory.py`, `distill.py`,
# `heads.py`): read it after you finish.

# %% tags=["setup"]
import torch
import torch.nn.functional as F
from torch import Tensor

from minillm.labkit import check
from minillm.speculative.verify import target_probs

# %%
import time

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from minillm import LLM, SamplingParams
from minillm.config import Components, SpeculativeConfig
from minillm.labkit import compare, quick_run
from minillm.models.registry import BUNDLED_DIR
from minillm.speculative.heads import HEADS_FILE

torch.set_num_threads(1)  # small model, small steps: one thread avoids thread-pool overhead

# %% [markdown]
# ## The concept: propose, verify, keep (~5 min)
#
# Take a sequence whose last token is `t`. Without speculation a step feeds `t` and gets one row of
# logits: the next token. With speculation the proposer first guesses `x1 x2 x3` (k = 3), and the
# step feeds all of `t x1 x2 x3` (the engine's scheduler gives the sequence 1 + k tokens to compute,
# lab 04's step with more tokens). Causal attention makes row i see only the tokens before it, so
# the **k + 1 rows of logits** are exactly what the target would have computed one step at a time:
#
# | row | has seen | judges |
# | --- | --- | --- |
# | 0 | … `t` | `x1` |
# | 1 | … `t x1` | `x2` (valid only if `x1` is kept) |
# | 2 | … `t x1 x2` | `x3` |
# | 3 | … `t x1 x2 x3` | nothing to judge: the **bonus** token after `x3` |
#
# The verifier walks the rows in order. It keeps `x1, x2, …` while the target agrees; at the
# first disagreement it emits the target's own token instead (a **correction**) and stops: the
# rows after it were computed from a token that is not in the text. If it agrees with all k, row k
# gives one more token for free. Either way a step emits `accepted + 1` tokens, never fewer than
# without speculation, and the engine drops the K/V of the rejected positions (their slots go
# back to the pool).
#
# What does "agrees" mean? For greedy decoding, "the proposal is the row's argmax". For sampling it
# takes a little probability, which is where we start.
#
# Throughout, the target's distributions come from `target_probs(logits, temperature, top_k, top_p)`
# (imported above from the engine): temperature, then top-k, then top-p, then softmax, row by row:
# your sampler of lab 02, as probabilities. A proposer that samples shapes its own distribution
# the same way.

# %% [markdown]
# ## Exercise 5.1 · The rejection step (~10 min)
#
# A draft drew the token `x` from its distribution `q`; the target would have drawn from `p`. We
# cannot emit `x` as it is: it comes out as often as `q` wants, not `p`. But we can *filter* it
# (Leviathan et al. 2023; Chen et al. 2023): keep `x` with some probability `a(x)` that we choose,
# and otherwise **reject** it (5.2 decides what to emit then).
#
# Through the filter, `x` comes out `q(x) · a(x)` of the time. Two demands fix `a`:
#
# 1. that must never exceed `p(x)`: a token emitted too often cannot be taken back by anything we
#    do after a rejection;
# 2. it should be as large as the first demand allows: every rejection throws away the rest of the
#    step's proposals. And `a(x)` is a probability, so it is at most 1.
#
# **A worked example, on other numbers.** The target wants `cat` with probability 0.15 and `dog`
# with 0.5; the draft proposes `cat` with 0.6 and `dog` with 0.2.
#
# * `cat` is over-proposed. Kept every time, it would come out 0.6 of the time, four times too
#   often. Kept a quarter of the time it comes out 0.6 × 0.25 = 0.15: exactly the target's share,
#   and no larger keep-rate meets demand 1.
# * `dog` is under-proposed: even kept every time it comes out only 0.2 < 0.5. Keep it always
#   (demand 2); the missing 0.3 is 5.2's business.
# * A token the target never writes (its `p` is 0) must never come out.
#
# Write the keep-probability for any `p` and `q`, then make the decision with one uniform draw: a
# number `u` uniform in [0, 1) is below `a` with probability exactly `a`. Draw it from the
# `generator` you are given: it is the request's own seeded generator, which makes every run of a
# request repeatable.

# %% exercise="5.1"
def accept(p: float, q: float, generator: torch.Generator) -> bool:
    """Keep or reject a token the proposer drew from q.

    Kept tokens must never come out more often than the target wants them, and, within that, as
    often as possible.

    p: the target's probability of the token, q: the proposer's; Python floats in [0, 1].
    -> True to keep the token, False to reject it (a bool, or anything bool() reads).
    Certain outcomes: a token the target never writes (p == 0 < q) is always rejected; a token the
    proposer gave no more mass than the target did (q <= p, q == 0 included) is always kept.
    Randomness comes only from `generator`, never from torch's global generator.

    Hints: 1 or 2 lines; more in the collapsed hints below.
    """
    ### BEGIN SOLUTION
    return q <= p or float(torch.rand((), generator=generator)) * q < p
    ### END SOLUTION


# %% [markdown]
# <details><summary>Hint 1: a nudge</summary>
#
# Write the keep-probability of `cat` (0.25) and of `dog` (1) above as one expression of `p` and `q`
# that gives both, and gives 0 when `p` is 0.
# </details>
#
# <details><summary>Hint 2: the idea</summary>
#
# Demand 1 says `q · a ≤ p`, so `a ≤ p / q`; demand 2 takes the largest `a` allowed, and `a` cannot
# pass 1. A uniform draw from `generator` (torch's uniform sampler takes a `generator=` argument)
# below `a` keeps the token.
# </details>
#
# <details><summary>Hint 3: the formula</summary>
#
# `a = min(1, p / q)`. Keep when `q <= p`, or else when `u * q < p`: the same test as `u < p / q`,
# with no division (and no surprise when `q` is 0).
# </details>
#
# Four tokens, each proposed with some `q` and wanted with some `p`: how often is each kept? The
# last column is the theory, for you to compare once you have found the rule.

# %%
gen = torch.Generator().manual_seed(0)
for p, q in ((0.6, 0.2), (0.3, 0.3), (0.2, 0.8), (0.0, 0.5)):
    kept = sum(accept(p, q, gen) for _ in range(4000)) / 4000
    print(f"p = {p:.1f}, q = {q:.1f}: kept {kept:.3f} of the time; the rule's probability {min(1, p / q):.3f}")

# %%
check("5.1")

# %% [markdown]
# ## Exercise 5.2 · The residual: what to draw after a rejection (~10 min)
#
# With your filter alone, over-proposed tokens come out exactly as often as the target wants, and
# under-proposed ones too rarely. When a proposal is rejected the step still emits one token, drawn
# from some distribution `r` we are free to choose. Choose it so that, all told, every token comes
# out with probability exactly `p`.
#
# **Back to the worked example**, now a whole vocabulary of three tokens:
#
# | token | `p` | `q` | comes out through the filter |
# | --- | --- | --- | --- |
# | `cat` | 0.15 | 0.6 | 0.6 × 0.25 = 0.15 |
# | `dog` | 0.5 | 0.2 | 0.2 × 1 = 0.2 |
# | `eel` | 0.35 | 0.2 | 0.2 × 1 = 0.2 |
#
# Proposals are kept 0.15 + 0.2 + 0.2 = 0.55 of the time, so a rejection happens 0.45 of the time.
# `cat` already has its share; `dog` is short by 0.3 and `eel` by 0.15. A residual that draws `dog`
# with 0.3 / 0.45 and `eel` with 0.15 / 0.45 fills those gaps exactly: `dog` gets 0.2 + 0.45 × 2/3
# = 0.5. Notice that the shortfalls add up to the chance of a rejection. Is that a coincidence of
# these numbers?
#
# Your turn: the residual for any `p` and `q`. Then the odd case: `p == q`. Nothing is short, and a
# rejection can never happen; return `p` then, so that the function always gives a distribution.

# %% exercise="5.2"
def residual(p: Tensor, q: Tensor) -> Tensor:
    """The distribution to draw from after a rejection.

    Kept proposals and draws from it must together emit every token with exactly the target's
    probability.

    p, q: [vocab] probabilities, the target's and the proposer's (non-negative, each summing to 1,
    of one float dtype). -> [vocab] in that dtype: non-negative, summing to 1, no NaN.
    When no token falls short at all (p == q, say), return p; any shortfall, however small, is
    a residual. Leaves p and q unchanged (no in-place operation on them).

    Hints: about 4 lines; more in the collapsed hints below.
    """
    ### BEGIN SOLUTION
    r = (p - q).clamp(min=0)  # [vocab]
    total = r.sum()
    return r / total if total > 0 else p
    ### END SOLUTION


# %% [markdown]
# <details><summary>Hint 1: a nudge</summary>
#
# In the table, how far below its `p` did each token come out? Write that shortfall for one token,
# for any `p` and `q`, including a token like `cat` that has no shortfall.
# </details>
#
# <details><summary>Hint 2: the idea</summary>
#
# Through the filter a token comes out the smaller of `p` and `q` of the time, so its shortfall is
# the positive part of `p − q`. The shortfalls sum to the chance of a rejection; scaled by that sum
# they are a distribution.
# </details>
#
# <details><summary>Hint 3: the formula</summary>
#
# `r = max(0, p − q) / Σ max(0, p − q)`, element-wise over the vocabulary; return `p` when that
# sum is 0.
# </details>
#
# Every token now comes out with probability `min(p, q) + (Σ max(0, p − q)) · r = p`: exactly `p`,
# whatever `q` is. A good proposer only makes rejections rarer; a bad one can never make the output
# wrong. The sum `α = Σ_y min(p(y), q(y))` (0.55 in the example) is the chance that a proposal is
# kept: the proposer's **acceptance rate** at this position, `1 −` the total variation distance
# between `p` and `q`. Keep it in mind for 5.5 and 5.6.
#
# Now the whole rejection sampler, on a six-token vocabulary: draw `x` from `q`, keep it or draw
# from the residual, 20,000 times. The proposer `q` is far from `p` on purpose; the emitted
# tokens follow `p` anyway.

# %%
p6 = torch.tensor([0.30, 0.25, 0.20, 0.15, 0.07, 0.03])
q6 = torch.tensor([0.05, 0.10, 0.40, 0.05, 0.30, 0.10])
gen, counts = torch.Generator().manual_seed(1), torch.zeros(6)
for _ in range(20_000):
    x = int(torch.multinomial(q6, 1, generator=gen))
    y = x if accept(float(p6[x]), float(q6[x]), gen) else int(torch.multinomial(residual(p6, q6), 1, generator=gen))
    counts[y] += 1
print(f"acceptance rate: sum min(p, q) = {float(torch.minimum(p6, q6).sum()):.2f}")
fig = go.Figure([go.Bar(name="q: the proposer", x=list(range(6)), y=q6.tolist()),
                 go.Bar(name="p: the target", x=list(range(6)), y=p6.tolist()),
                 go.Bar(name="emitted (20,000 draws)", x=list(range(6)), y=(counts / counts.sum()).tolist())])
fig.update_layout(title="Rejection sampling turns q's proposals into p's samples", xaxis_title="token",
                  yaxis_title="probability", height=320)
fig.show()

# %%
check("5.2")

# %% [markdown]
# ## Exercise 5.3 · Verify: the longest acceptable prefix, then one token more (~15 min)
#
# Now the verifier the engine calls after every speculative step, for each speculating sequence.
# It gets the k + 1 rows of logits of the concept's table, the k proposals, and `q`: the k
# distributions the proposals were drawn from, one row each. A proposer that draws nothing (prompt
# lookup, 5.4) passes `q = None`: it proposed each token with certainty. What is `q` then, as a
# distribution, and what do your 5.1 and 5.2 make of it?
#
# The rules it keeps:
#
# * **Greedy** (`temperature == 0`): the target's token after any prefix is its most likely one.
#   A proposal is kept only if the target would have written it itself, and only while every
#   proposal before it was kept. The step's own token is the target's after the kept ones.
# * **Sampling**: the target's distribution at each row is `target_probs(logits, temperature,
#   top_k, top_p)` (its lab 02 filters, as probabilities). Each proposal is decided by your 5.1 on
#   that row, in order; the first rejection ends the walk, and its token comes from your 5.2. A
#   proposal after a rejected one is never looked at: its row was computed from a token that is not
#   in the text.
#
# **A worked example, on other numbers** (greedy, k = 2, a vocabulary of 4): rows whose most likely
# tokens are 3, 0, 2. The proposals `[3, 1]`: 3 is kept (row 0 wants 3), 1 is not (row 1 wants 0),
# and the step emits 0 after one kept proposal. The proposals `[3, 0]`: both kept, and row 2 gives 2
# as the bonus: the step emitted three tokens.
#
# Every emitted token is then distributed as the target's own sample would be, position after
# position; draw tokens as your lab 02 sampler did, from `generator`.

# %% exercise="5.3"
def verify(logits: Tensor, proposals: list[int], q: Tensor | None, temperature: float, top_k: int,
           top_p: float, generator: torch.Generator) -> tuple[int, int]:
    """Verify k proposals against the target's logits.

    -> (accepted, token), both Python ints: how many proposals the target keeps, counted from the
    first (0 <= accepted <= k), and the token it emits after them (accepted == k: the bonus token).

    logits: [k + 1, vocab], the target's; row i was computed after proposals[:i], row k after all.
    proposals: k >= 1 token ids. q: [k, vocab], row i the distribution proposals[i] was drawn from;
        or None: each proposal was made with certainty.
    temperature == 0 (greedy): deterministic, no draw from `generator`; q plays no part.
    temperature > 0: the kept proposals and the token are distributed, position by position, as the
        target's own samples under (temperature, top_k, top_p), whatever q is. Uses accept (5.1)
        and residual (5.2); every random draw comes from `generator`.
    Leaves logits, proposals and q unchanged.

    Hints: about 12 lines; more in the collapsed hints below.
    """
    ### BEGIN SOLUTION
    k = len(proposals)
    if temperature == 0:
        best = logits.argmax(-1).tolist()  # the target's own token after each prefix
        accepted = next((i for i in range(k) if proposals[i] != best[i]), k)
        return accepted, best[accepted]
    p = target_probs(logits, temperature, top_k, top_p)  # [k + 1, vocab]
    for i, x in enumerate(proposals):
        q_i = q[i] if q is not None else F.one_hot(torch.tensor(x), p.shape[-1]).to(p)  # [vocab]
        if not accept(float(p[i, x]), float(q_i[x]), generator):
            return i, int(torch.multinomial(residual(p[i], q_i), 1, generator=generator))
    return k, int(torch.multinomial(p[k], 1, generator=generator))  # every proposal kept: the bonus token
    ### END SOLUTION


# %% [markdown]
# <details><summary>Hint 1: a nudge</summary>
#
# Do the greedy case first: find the first position where a proposal differs from the row's most
# likely token. What does `accepted` equal when there is none? For sampling, a certain proposal's
# `q` is a distribution with all its mass on the proposal.
# </details>
#
# <details><summary>Hint 2: the idea</summary>
#
# Sampling walks i = 0, 1, …: decide proposals[i] with 5.1 on `p[i]` and `q[i]` at that token; on
# a rejection, return i and a draw from 5.2's residual of those two rows. If the walk ends without a
# rejection, the bonus is a draw from row k of `p`. With `q = None`, build the missing row as a
# one-hot vector at the proposal, in `p`'s dtype.
# </details>
#
# <details><summary>Hint 3: the formula</summary>
#
# Greedy: `best = argmax of each row`; `accepted` = the first i with proposals[i] != best[i], else
# k; return `(accepted, best[accepted])`. Sampling: `p = target_probs(...)`; for each i, with
# `x = proposals[i]`: `if not accept(p[i, x], q_i[x], generator): return i, draw(residual(p[i], q_i))`;
# after the loop `return k, draw(p[k])`, each draw one token from the generator.
# </details>
#
# A target over 5 tokens that, at temperature 0, wants 2, then 4, then 1, then 0. Three
# proposals that get the first two right stop at the third: two accepted, then the target's own 1.
# All three right: three accepted, and the bonus 0.

# %%
target = torch.tensor([[0.1, 0.2, 3.0, 0.0, 0.5], [0.0, 0.3, 0.1, 0.2, 2.0],
                       [0.2, 1.5, 0.0, 0.4, 0.1], [2.5, 0.0, 0.3, 0.1, 0.2]])  # [k + 1 = 4, vocab = 5]
print("greedy, proposals [2, 4, 3]:", verify(target, [2, 4, 3], None, 0.0, 0, 1.0, torch.Generator()))
print("greedy, proposals [2, 4, 1]:", verify(target, [2, 4, 1], None, 0.0, 0, 1.0, torch.Generator()))

# %% [markdown]
# Sampled, a proposer that drew each proposal from its own `q` (here: the target's rows, blurred)
# has, at each position, the chance `α_i = Σ min(p_i, q_i)` of being kept, and a step keeps at
# least `j` proposals with probability `α_1 ⋯ α_j`. Count it over 5,000 steps:

# %%
p4 = target_probs(target, 1.0, 0, 1.0)                  # [4, 5]
q3 = target_probs(target[:3] * 0.4, 1.0, 0, 1.0)        # [3, 5]: a flatter, worse guess
alphas = torch.minimum(p4[:3], q3).sum(-1)              # [3]
gen, runs, at_least = torch.Generator().manual_seed(2), 5000, torch.zeros(4)
for _ in range(runs):
    proposals = torch.multinomial(q3, 1, generator=gen).flatten().tolist()
    accepted, _ = verify(target, proposals, q3, 1.0, 0, 1.0, gen)
    at_least[:accepted + 1] += 1
print("alpha per position:", [round(a, 3) for a in alphas.tolist()])
print("P(at least j kept), measured:", [round(v, 3) for v in (at_least / runs).tolist()])
print("P(at least j kept), product:  ", [round(v, 3) for v in torch.cat([torch.ones(1), alphas.cumprod(0)]).tolist()])

# %%
check("5.3")

# %% [markdown]
# ## Exercise 5.4 · Prompt lookup: proposals for free (~10 min)
#
# A lot of generated text repeats its context: a model editing code rewrites most lines as they
# were, a summary quotes its source, an answer restates the question, and a small model stuck in a
# loop repeats itself. **Prompt lookup** (Saxena 2023; vLLM's `ngram` method) exploits that with no
# model at all: find the last few tokens earlier in the sequence, and propose what followed them
# there. It must propose exactly what the engine's does (the grader compares them), so here are
# the engine's rules:
#
# * it looks up the last `n` tokens of `token_ids` (the prompt and the output so far) at an earlier
#   position; an earlier occurrence may overlap the last `n` tokens, but it is not those tokens
#   themselves;
# * of several earlier occurrences, the **latest** wins (recent context predicts best);
# * it proposes up to `k` of the tokens that followed that occurrence, never past the end of
#   `token_ids` (no token exists there yet);
# * if the last `n` never occurred before, it tries the last `n − 1`, and so on down to the last
#   token alone: a longer match always wins over a shorter one, however late the shorter one is;
#   if even the last token never occurred, it proposes nothing (`[]`).
#
# **A worked example, on other numbers**: `token_ids = [3, 8, 3, 8, 5, 3, 8]`, `n = 2`, `k = 3`.
# The last two tokens `[3, 8]` occur earlier at positions 0 and 2; the latest is at 2, followed by
# `5, 3, 8`: the proposals. With `k = 5` they are still `[5, 3, 8]`: the history ends there. Look
# for the edge cases too: a history of one token, an `n` longer than the history, an occurrence that
# starts at position 0.
#
# The proposals come with certainty, so the engine passes `q = None` to your verifier.

# %% exercise="5.4"
def propose_ngram(token_ids: list[int], n: int, k: int) -> list[int]:
    """Prompt lookup's proposals, under the engine's rules (above).

    -> at most k token ids (Python ints), in order; [] when not even the last token occurred
    earlier (a history of 0 or 1 tokens included).

    token_ids: the prompt and the output so far (not modified). n >= 1: the longest run of last
    tokens to look up (longer than the history allows: the longest that fits). k >= 1.

    Hints: about 7 lines; more in the collapsed hints below.
    """
    ### BEGIN SOLUTION
    for m in range(min(n, len(token_ids) - 1), 0, -1):
        tail = token_ids[-m:]
        for s in range(len(token_ids) - m - 1, -1, -1):  # latest first, never the tail itself
            if token_ids[s:s + m] == tail:
                return token_ids[s + m:s + m + k]
    return []
    ### END SOLUTION


# %% [markdown]
# <details><summary>Hint 1: a nudge</summary>
#
# Two choices are made in order: first how many last tokens to match (the longest that has an
# earlier occurrence), then which occurrence (the latest). Which loop goes outside?
# </details>
#
# <details><summary>Hint 2: the idea</summary>
#
# For m from the longest that fits down to 1, take the last m tokens and scan the start positions
# from the latest one that is not the tail itself back to 0; the first match returns what follows
# it, cut at k and at the end of the history.
# </details>
#
# <details><summary>Hint 3: the formula</summary>
#
# m runs from `min(n, len(token_ids) - 1)` down to 1; start positions s from `len(token_ids) - m - 1`
# down to 0; on a match return `token_ids[s + m : s + m + k]`. After both loops, `[]`.
# </details>

# %%
ids = [5, 6, 7, 8, 1, 5, 6, 7, 9, 2, 5, 6, 7]
print(propose_ngram(ids, 3, 4), "  (the latest earlier [5, 6, 7] was followed by 9, 2, 5, 6)")
print(propose_ngram(ids + [9], 3, 4), "  ([6, 7, 9] occurred once before; the history ends 3 tokens later)")
print(propose_ngram([4, 1, 9, 8, 4], 3, 2), "  (only [4] occurred before)")

# %%
check("5.4")

# %% [markdown]
# ## Exercise 5.5 · What to expect: tokens per forward (~5 min)
#
# Say each proposal the verifier reaches is kept with probability `α`, independently of the others.
# How many tokens does a step emit on average? It always emits one of the target's own (the
# correction or the bonus), plus one for each proposal kept, and a proposal counts only if every
# proposal before it was kept.
#
# **A worked example, on other numbers**: k = 2, α = 0.6. The step's outcomes:
#
# | outcome | probability | tokens emitted |
# | --- | --- | --- |
# | the first proposal rejected | 0.4 | 1 |
# | the first kept, the second rejected | 0.6 × 0.4 = 0.24 | 2 |
# | both kept, then the bonus | 0.6 × 0.6 = 0.36 | 3 |
#
# On average 0.4 + 0.48 + 1.08 = 1.96 tokens per forward of the target, where plain decoding gets 1.
# Now do it for any α and k: write the average as a sum (group the outcomes by "at least j
# proposals kept"), then find its closed form; you have met this sum before. What is it at α = 1,
# where the closed form cannot be evaluated as written? And what is its limit as k grows?
#
# The independence is an approximation: real acceptance depends on the text (a proposer nails a
# repeated line, then misses a whole new one). The engine counts both α and the tokens per forward
# it got, so you will compare your formula with the measurement.

# %% exercise="5.5"
def expected_tokens_per_forward(alpha: float, k: int) -> float:
    """Tokens a speculative step emits on average, per forward of the target.

    They are the kept proposals plus the target's own token, for k proposals each kept with
    probability alpha, independently, and counted only while every earlier one was kept.

    alpha: a Python float in [0, 1]; k: int >= 0 proposals. -> a float, in tokens per forward: 1 for
    alpha == 0 or k == 0, at most one more than k. Exact at alpha == 1 (no division by zero), and as
    accurate as the closed form allows for alpha just below 1 (never rounded to 1).
    Raises ValueError for an alpha outside [0, 1], NaN included, saying what it got.

    Hints: about 4 lines; more in the collapsed hints below.
    """
    ### BEGIN SOLUTION
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha is a probability, in [0, 1]; got {alpha}")
    return k + 1.0 if alpha == 1 else (1 - alpha ** (k + 1)) / (1 - alpha)
    ### END SOLUTION


# %% [markdown]
# <details><summary>Hint 1: a nudge</summary>
#
# In the table, the chance that at least j proposals are kept is 0.6 to the power j. The average
# number kept is the sum, over j, of "at least j kept".
# </details>
#
# <details><summary>Hint 2: the idea</summary>
#
# The average is 1 + α + α² + … + α^k, a geometric series; its closed form divides by 1 − α, so
# α = 1 needs its own answer (every term is 1). Refuse an α outside [0, 1] first; a NaN fails every
# comparison, so test that α is inside rather than that it is outside.
# </details>
#
# <details><summary>Hint 3: the formula</summary>
#
# `(1 - alpha ** (k + 1)) / (1 - alpha)`, and `k + 1` at `alpha == 1` exactly.
# </details>

# %%
ks = list(range(1, 11))
fig = go.Figure([go.Scatter(x=ks, y=[expected_tokens_per_forward(a, k) for k in ks], name=f"α = {a}")
                 for a in (0.5, 0.7, 0.8, 0.9)])
fig.update_layout(title="Tokens per target forward, your formula", xaxis_title="k (proposals per step)",
                  yaxis_title="tokens per forward", height=320)
fig.show()

# %%
check("5.5")

# %% [markdown]
# Tokens per forward is not yet a speedup: a step that verifies k proposals computes k + 1
# positions instead of one, and a draft model spends k forwards of its own to propose. If a
# speculative step costs `c_k` plain decode steps, the speedup is
#
# $$\text{speedup} = \frac{1 - α^{k+1}}{(1 - α)\, c_k}.$$
#
# On a GPU at batch 1, verifying a handful of tokens costs about one decode step, and a draft
# 20 times smaller adds k/20 of one (Leviathan et al. write `c_k = 1 + c k`, with `c` the draft's
# cost per forward relative to the target's). A CPU has far less idle arithmetic to spend (lab
# 00's ridge point is much lower), so there `c_k` grows faster with k. You will measure it below.

# %% [markdown]
# ## Exercise 5.6 · Distillation: a draft that agrees with its target (~10 min)
#
# The acceptance rate of a draft at a position is `α = Σ min(p, q) = 1 − TV(p, q)`: the closer its
# distribution `q` to the target's `p`, the more survives. A small model trained on the corpus
# learns to predict the corpus, not the target. **Distillation** trains it on the target's own
# distributions instead (Hinton et al. 2015; DistillSpec, Zhou et al. 2024): run the target over
# the training text, and at every position push the draft's distribution toward the target's, by
# minimising a Kullback–Leibler divergence. Its definition (standard; the exercise is choosing and
# computing it right, not this formula): for two distributions `a` and `b`,
# `KL(a ‖ b) = Σ_y a(y) (log a(y) − log b(y))`, zero only when they are equal, and not symmetric.
#
# Three choices make it a distillation loss:
#
# 1. **The direction.** Which of the two is `a`, the one the sum weights by? Try it on other numbers:
#    a teacher `(0.5, 0.5)` and a student that ignores the second token, `(0.99, 0.01)`. One
#    direction gives `0.5 ln(0.5/0.99) + 0.5 ln(0.5/0.01) ≈ 1.61` nats, the other
#    `0.99 ln(0.99/0.5) + 0.01 ln(0.01/0.5) ≈ 0.64`. The draft must propose everything the target
#    might say (a token it never proposes can only come from the residual, after a rejection):
#    which direction punishes the student that misses the target's mass more?
# 2. **A temperature `T`**, dividing both sets of logits before their softmax, softens both
#    distributions so the student also learns how the target ranks its unlikely tokens. Softening
#    shrinks the loss's gradients by about `T²` (each softmax's gradient carries a `1/T`), so the
#    loss is scaled back up to keep their size whatever `T` is.
# 3. **The numbers.** A probability can underflow to 0 in float32 while its logarithm is still a
#    fine number (a logit 120 below the others); and logits often arrive in bfloat16, whose 8 bits
#    of mantissa cannot hold a loss that training needs to the fourth digit.
#
# Average over the tokens, so that the loss does not grow with the batch.
#
# Pinsker's inequality, `TV ≤ sqrt(KL / 2)`, says that pushing KL down pushes α up.

# %% exercise="5.6"
def distill_loss(student_logits: Tensor, teacher_logits: Tensor, temperature: float = 1.0) -> Tensor:
    """The distillation loss of a draft (the student) toward its target (the teacher).

    The KL divergence that punishes the student for missing the teacher's mass, at `temperature`,
    averaged over the tokens, scaled so that its gradient's size does not depend on the temperature.

    student_logits, teacher_logits: [..., vocab] of one shape, any float dtype (bfloat16 included);
    every index but the last is a token. temperature > 0 (1: the models' own distributions).
    -> a 0-d float32 tensor, in nats, >= 0 (0 when the two distributions agree); computed in
    float32 whatever the inputs' dtype, finite where a probability underflows to 0.
    It keeps its gradient with respect to student_logits (it trains the draft); the inputs are not
    modified.

    Hints: about 4 lines; more in the collapsed hints below.
    """
    ### BEGIN SOLUTION
    t = temperature
    teacher = F.log_softmax(teacher_logits.float() / t, dim=-1)  # [..., vocab]
    student = F.log_softmax(student_logits.float() / t, dim=-1)
    kl = (teacher.exp() * (teacher - student)).sum(-1)  # [...]: one KL per token
    return kl.mean() * t * t
    ### END SOLUTION


# %% [markdown]
# <details><summary>Hint 1: a nudge</summary>
#
# The direction that punishes missing mass weights by the teacher. Work in log-probabilities from
# the start: torch has a function that gives the log of a softmax without forming the softmax.
# </details>
#
# <details><summary>Hint 2: the idea</summary>
#
# Convert both sets of logits to float32, divide by the temperature, take log-softmax over the
# vocabulary; weight the difference (teacher − student) by the teacher's probabilities, sum over the
# vocabulary (one KL per token), average over the tokens, multiply by the temperature squared.
# </details>
#
# <details><summary>Hint 3: the formula</summary>
#
# With `lp = log_softmax(teacher / T)`, `lq = log_softmax(student / T)` in float32:
# `(exp(lp) * (lp - lq)).sum(-1).mean() * T * T`.
# </details>

# %%
check("5.6")

# %% [markdown]
# Does the loss measure what a draft is for? `tiny` is the target, `pico` (several times smaller;
# the parameter counts are printed) the draft. At every position of some held-out code, compute the
# KL from tiny to pico and the acceptance rate `α = Σ min(p, q)` at temperature 1. The bundled
# `pico-distilled` (distilled by `python -m minillm train distill`: [docs/models.md](../docs/models.md)
# tells how) is measured too; later in this lab you distill one yourself.

# %%
target_llm = LLM("tiny")
held_out = ("import json\nimport os\n\n\ndef load(path):\n    with open(path) as f:\n        return json.load(f)\n\n\n"
            "class Cache:\n    def __init__(self, size):\n        self.size = size\n        self.items = {}\n\n"
            "    def get(self, key, default=None):\n        return self.items.get(key, default)\n")
tokens = target_llm.tokenizer.encode(held_out)
teacher_logits = target_llm.logits(tokens)  # [len, vocab]
drafts = {"pico": "pico"}
if (BUNDLED_DIR / "pico-distilled" / "config.json").is_file():
    drafts["pico, distilled"] = "pico-distilled"
else:
    print("(no distilled pico in minillm/assets/models/pico-distilled: measuring pico alone)")
fig, worst = go.Figure(), 0.0
for name, model in drafts.items():
    student_logits = LLM(model).logits(tokens)
    kl = torch.stack([distill_loss(student_logits[i:i + 1], teacher_logits[i:i + 1]) for i in range(len(tokens))])
    alpha = torch.minimum(teacher_logits.softmax(-1), student_logits.softmax(-1)).sum(-1)  # [len]
    print(f"{name}: mean KL(tiny || draft) {float(kl.mean()):.3f} nats, mean acceptance rate {float(alpha.mean()):.3f} "
          f"over {len(tokens)} positions")
    fig.add_trace(go.Scatter(x=kl.tolist(), y=alpha.tolist(), mode="markers", name=name, opacity=0.6))
    worst = max(worst, float(kl.max()))
kl_axis = torch.linspace(0.0, worst, 60)
fig.add_trace(go.Scatter(x=kl_axis.tolist(), y=(1 - (kl_axis / 2).sqrt()).clamp(min=0).tolist(),
                         name="Pinsker: α ≥ 1 - sqrt(KL / 2)", line=dict(dash="dash")))
fig.update_layout(title="Per position: the closer the draft (low KL), the more of it is accepted",
                  xaxis_title="KL(tiny || draft), nats", yaxis_title="acceptance rate Σ min(p, q)", height=360)
fig.show()

# %% [markdown]
# ## Exercise 5.7 · Multi-token prediction: proposals from the target's own hidden state (~15 min)
#
# A draft model is a second model, with k forwards of its own per step. **Medusa** (Cai et al. 2024)
# proposes with no second model: the target's last hidden state `h`, the vector its LM head turns
# into the next token, already knows something about the tokens after that. Train a few small
# **heads** on `h`, the first guessing the token after next, the second the one after that, and so
# on, each read through the target's own LM head. A proposal then costs k small layers and one pass
# over the LM head, not k forwards of a model. (DeepSeek-V3's multi-token prediction and EAGLE's
# draft layer are richer versions of the same idea.)
#
# The heads bundled with `tiny` (`minillm/assets/models/tiny/spec_heads.safetensors`, fitted by
# `python -m minillm train heads` with tiny frozen) are each one residual block. What was trained
# (a definition, which you cannot derive): head i turns `h` into `h + SiLU(W_i h + b_i)`, where
# `blocks[i]` is the `nn.Linear` holding `W_i` and `b_i`, and its guess is read through the LM head.
#
# **Which positions?** The engine keeps, for each sequence, the hidden state of the last token the
# target *computed*. Its LM head already gave the token after it, and the verifier has emitted that
# token: it is in the sequence, not to be proposed. A worked example, in words: the target computed
# `the cat`; `h` is its state after `cat`, and its LM head said `sat`, now the sequence's last token.
# With three heads, the first guesses the token after `sat` (`on`, say), the second the one after
# that (`the`), the third `mat`. Asked for k = 2 proposals, the step proposes `[on, the]`: the
# chain of the first k heads' guesses, nearest first.
#
# Two more things to decide: each head's guess is its **top** token (the proposals come with
# certainty, like prompt lookup's, so the verifier gets `q = None`, which keeps sampled output exact
# too, by your 5.3); and the engine asks for all speculating sequences at once, one row of `hidden`
# each. Does any head read another head's output?

# %% exercise="5.7"
def propose_heads(hidden: Tensor, blocks: torch.nn.ModuleList, lm_head: torch.nn.Module, k: int) -> list[list[int]]:
    """The heads' proposals for a batch of sequences.

    Each sequence's k guesses, nearest first: the same the engine's own heads proposal gives.

    hidden: [B, hidden] (float32 or bfloat16), the target's hidden state after the last token it
        computed, one row per sequence; B >= 0.
    blocks: the trained heads, one nn.Linear(hidden, hidden) each; blocks[0] guesses the nearest
        position. lm_head: the target's LM head, [..., hidden] -> [..., vocab] logits.
    k: proposals per sequence, 0 <= k <= len(blocks).
    -> B lists of k token ids (Python ints), each a head's most likely token (a tie: the lowest id).
    Raises ValueError for a k outside [0, len(blocks)], naming both. Leaves hidden and the modules
    unchanged; needs no gradient (the engine calls it under inference mode).

    Hints: about 5 lines; more in the collapsed hints below.
    """
    ### BEGIN SOLUTION
    if not 0 <= k <= len(blocks):
        raise ValueError(f"k = {k} proposals asked of {len(blocks)} heads; 0 <= k <= {len(blocks)}")
    if k == 0:
        return [[] for _ in range(len(hidden))]
    guesses = torch.stack([hidden + F.silu(block(hidden)) for block in blocks[:k]], dim=1)  # [B, k, hidden]
    return lm_head(guesses).argmax(-1).tolist()  # one pass over the LM head for all k heads
    ### END SOLUTION


# %% [markdown]
# <details><summary>Hint 1: a nudge</summary>
#
# Every head reads the same `h`; none reads another head's output. The chain is only the order in
# which their guesses are proposed.
# </details>
#
# <details><summary>Hint 2: the idea</summary>
#
# For each of the first k heads build its guess of a hidden state from `h` (the residual block
# above), read it through the LM head to logits over the vocabulary, and take each row's most likely
# token. Stacking the k guesses to `[B, k, hidden]` first lets the LM head's weights be read once.
# k = 0 still owes B empty lists.
# </details>
#
# <details><summary>Hint 3: the formula</summary>
#
# `guess_i = hidden + silu(blocks[i](hidden))` for i < k; `logits = lm_head(stack(guesses, dim=1))`,
# `[B, k, vocab]`; the answer is its argmax over the last dimension, as nested Python lists.
# </details>
#
# Your proposal on tiny's bundled heads: a prompt, tiny's own greedy continuation, and what the
# heads guessed from the hidden state after the prompt's last token. The first token of the
# continuation is the LM head's; the heads guess the ones after it.

# %%
from minillm.speculative.heads import load_heads
from minillm.training.train_heads import final_hidden

if (BUNDLED_DIR / "tiny" / HEADS_FILE).is_file():
    tiny_heads = load_heads(BUNDLED_DIR / "tiny" / HEADS_FILE, target_llm.model)
    prompt = target_llm.tokenizer.encode("def read_lines(path):\n    with open(path) as f:\n        return")
    with torch.inference_mode():
        h = final_hidden(target_llm.model, torch.tensor([prompt]))[:, -1]  # [1, hidden]: after the last prompt token
        guessed = propose_heads(h, tiny_heads.blocks, target_llm.model.lm_head, 4)[0]
    written = target_llm.generate([prompt], SamplingParams(max_tokens=5, temperature=0), use_tqdm=False)[0].token_ids
    print(f"tiny writes, greedily:      {written}  ({target_llm.tokenizer.decode(written)!r})")
    print(f"the heads guessed for 2..5: {guessed}  ({target_llm.tokenizer.decode(guessed)!r})")
    print(f"the first k kept by greedy verification: "
          f"{next((i for i, (a, b) in enumerate(zip(guessed, written[1:])) if a != b), len(guessed))} of 4")
else:
    print(f"(no trained heads at minillm/assets/models/tiny/{HEADS_FILE}: `python -m minillm train heads` makes them)")

# %%
check("5.7")

# %% [markdown]
# ## Your verifier and proposers inside minillm (~5 min)
#
# The engine takes its verifier and its proposers' steps from `EngineConfig.components`. With
# `SpeculativeConfig("ngram", k=...)` every step your `propose_ngram` proposes, the target scores
# the proposals in the step's forward, and your `verify` decides what each sequence keeps. With
# `SpeculativeConfig("heads", k=...)` your `propose_heads` proposes from each sequence's hidden
# state (`check("5.7")` already ran it inside the engine against the engine's own heads proposal).
# Every run below uses all three of your parts.
#
# `check("5.E")` (also part of `make grade LAB=05`) runs the workload of labs 02 to 04 (chunked
# prefill, prefix-cache hits, parallel samples, preemption) with prompt lookup at k = 3 through the
# engine with your parts and through the engine with its own: greedy tokens must be identical
# (speculation may never change them), every KV block must be back in the pool (rejected positions
# included), and your parts must propose and keep exactly what the engine's would. Sampled output
# cannot be compared token by token: a correct verifier may use its random numbers in another
# order. That exactness is what the statistical checks of 5.1 to 5.3 test.

# %%
YOURS = Components(verify=verify, propose_ngram=propose_ngram, propose_heads=propose_heads, source="this notebook")
check("5.E")

# %% [markdown]
# ## Measure it: acceptance, tokens per forward and speed, against k (~5 min)
#
# The target is `tiny`; the proposers are prompt lookup (your code), the `pico` draft model (the
# engine's, verified by your code), and, if they have been trained, `tiny`'s multi-token-prediction
# heads (your 5.7 on the bundled heads, no second model) and the bundled distilled pico. Requests
# run one at a time (batch 1, the latency case speculation is for), greedy, on code prompts. The
# engine counts, per step and sequence, what was proposed, reached (verification stops at the first
# rejection) and accepted: `α = accepted / reached`.
#
# Each run is timed too: tokens per second against the same requests without speculation, and the
# median time of a decode step with and without, which gives `c_k`.

# %% [markdown]
# **Predict first.** For each proposer, guess its α on these code prompts (does pico agree with tiny
# more often than not? do the heads, which see tiny's own state? does code repeat itself within 40
# tokens?), then turn each guess into tokens per forward at k = 4 with your 5.5. The cell after the
# sweep prints your number beside the theory (5.5 on the α the engine measured) and the measurement.

# %%
MY_PREDICTIONS = {"prompt lookup": None, "pico draft": None, "MTP heads": None, "distilled pico": None}
# tokens per forward at k = 4, one number per proposer: work them out from your guess of α and 5.5

# %%
def proposers() -> dict:
    """name -> a function k -> SpeculativeConfig; proposers whose files are missing are left out, with a note."""
    found = {"prompt lookup": lambda k: SpeculativeConfig("ngram", k=k),
             "pico draft": lambda k: SpeculativeConfig("draft", k=k)}
    if (BUNDLED_DIR / "tiny" / HEADS_FILE).is_file():
        found["MTP heads"] = lambda k: SpeculativeConfig("heads", k=k)
    else:
        print(f"(no trained heads at minillm/assets/models/tiny/{HEADS_FILE}: `python -m minillm train heads` "
              "makes them; skipping that proposer)")
    if (BUNDLED_DIR / "pico-distilled" / "config.json").is_file():
        found["distilled pico"] = lambda k: SpeculativeConfig("draft", k=k, draft_model="pico-distilled")
    else:
        print("(no distilled draft at minillm/assets/models/pico-distilled: `python -m minillm train distill` "
              "makes it; skipping that proposer)")
    return found


def run(spec: SpeculativeConfig | None, prompts: list[list[int]] | list[str], params: SamplingParams,
        batch: int = 1, repeats: int = 2, model: str = "tiny", num_kv_blocks: int = 512) -> dict | None:
    """The prompts through `model` with this speculation (None: none), `batch` at a time; the fastest of
    `repeats` runs. -> tokens/s, the engine's speculation counts, the median decode step's seconds."""
    try:
        llm = LLM(model, speculative=spec, components=YOURS, max_num_seqs=batch, num_kv_blocks=num_kv_blocks)
    except ValueError as e:  # heads trained for fewer tokens ahead than this k, say
        print(f"  skipped {spec}: {e}")
        return None
    llm.generate(prompts[:1], SamplingParams(max_tokens=4, temperature=0), use_tqdm=False)  # warm-up
    steps = []
    llm.engine.subscribe(lambda e: steps.append(e.duration) if all(w.phase == "decode" for w in e.scheduled) else None)
    best, outputs = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        best = min(best, time.perf_counter() - start)
        outputs = [o.token_ids for o in outs]
    stats = llm.engine.speculator.stats if spec else None
    return {"tok/s": sum(map(len, outputs)) / best, "stats": stats, "outputs": outputs,
            "step": sorted(steps)[len(steps) // 2]}


code_texts = ["def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):",
              "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):",
              "import os\nimport sys\n\n\ndef main(argv):", "for i in range(10):\n    print(i)\nfor j in range(10):"]
code = [target_llm.tokenizer.encode(t) for t in code_texts]
greedy = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
QUICK = quick_run()  # under the test suite: fewer k and one timing each, the same method
REPEATS = 1 if QUICK else 2
plain = run(None, code, greedy, repeats=REPEATS)
K = [1, 4] if QUICK else [1, 2, 4, 8]
sweep = {name: {k: run(make(k), code, greedy, repeats=REPEATS) for k in K} for name, make in proposers().items()}
sweep = {name: {k: r for k, r in runs.items() if r} for name, runs in sweep.items()}
print("greedy outputs identical to no speculation:",
      all(r["outputs"] == plain["outputs"] for runs in sweep.values() for r in runs.values()))

# %%
print(f"without speculation: {plain['tok/s']:.0f} tok/s, a decode step {plain['step'] * 1e3:.1f} ms\n")
print(f"{'proposer':>15} {'k':>2} {'α':>6} {'tok/fwd':>8} {'theory':>7} {'c_k':>5} {'predicted':>10} {'measured':>9}")
for name, runs in sweep.items():
    for k, r in runs.items():
        s = r["stats"]
        theory = expected_tokens_per_forward(s.acceptance_rate, k)
        cost = r["step"] / plain["step"]
        print(f"{name:>15} {k:2d} {s.acceptance_rate:6.3f} {s.tokens_per_forward:8.2f} {theory:7.2f} {cost:5.2f} "
              f"{s.tokens_per_forward / cost:9.2f}x {r['tok/s'] / plain['tok/s']:8.2f}x")

fig = make_subplots(rows=1, cols=2, subplot_titles=("tokens per target forward: measured (dots), theory (dashes)",
                                                    "speedup in tokens/s, measured"))
for i, (name, runs) in enumerate(sweep.items()):
    color = ("#3d6fb6", "#e4572e", "#2a9d8f", "#8a5cf6")[i % 4]
    ks = list(runs)
    fig.add_trace(go.Scatter(x=ks, y=[runs[k]["stats"].tokens_per_forward for k in ks], mode="markers+lines",
                             name=name, line=dict(color=color)), row=1, col=1)
    fig.add_trace(go.Scatter(x=ks, y=[expected_tokens_per_forward(runs[k]["stats"].acceptance_rate, k) for k in ks],
                             mode="lines", line=dict(color=color, dash="dash"), showlegend=False), row=1, col=1)
    fig.add_trace(go.Scatter(x=ks, y=[runs[k]["tok/s"] / plain["tok/s"] for k in ks], mode="markers+lines",
                             line=dict(color=color), showlegend=False), row=1, col=2)
fig.add_hline(y=1.0, line_dash="dot", row=1, col=2)
fig.update_xaxes(title_text="k", type="log", tickvals=K)
fig.update_layout(height=380, title="Speculation on tiny, greedy code prompts, batch 1")
fig.show()

# %%
for name, runs in sweep.items():
    if 4 in runs:
        s = runs[4]["stats"]
        compare(f"{name} on tiny, k = 4: tokens per forward", MY_PREDICTIONS.get(name),
                theory=expected_tokens_per_forward(s.acceptance_rate, 4), measured=s.tokens_per_forward,
                unit="tokens/forward", theory_name=f"5.5 at the measured α = {s.acceptance_rate:.2f}",
                gap="above the theory: acceptances came in runs (a whole copied line); below: misses came in runs")

# %% [markdown]
# Read the table column by column:
#
# * **α** is how often a reached proposal survives. Does it move with k? Later proposals are
#   reached only after earlier ones were right, which happens more often in easy, repetitive text,
#   so α at a large k is measured on easier positions than at k = 1.
# * **tok/fwd against theory**: the formula of 5.5 with the measured α. Where they differ,
#   acceptance is not independent from one position to the next (it comes in runs: a proposer
#   that copies a line gets the whole line; misses come in runs too), the assumption behind the
#   formula.
# * **c_k** is what a speculative step costs in plain decode steps. For prompt lookup it is the
#   price of computing k + 1 positions instead of one; for a draft, add k forwards of it. Read how
#   it grows with k on your machine. Speculation's premise is lab 00's: a decode step waits on
#   memory, so extra rows of arithmetic ride along for free. `tiny`'s 23 MB of weights (float32)
#   may stay largely in a CPU's caches from one step to the next; then its step is bound by
#   arithmetic and per-operation overhead rather than memory, and a matrix product of 2 rows can
#   cost noticeably more than one of 1 row. A model of billions of parameters on a GPU is the
#   clear case: there verifying a few tokens costs about one step. Pico has a fraction of tiny's
#   parameters, yet the draft's `c_k` at k = 1 shows how much one pico forward adds to a step: below
#   some size, a model's cost is the number of operations it launches more than its bytes.
# * **predicted** (tok/fwd ÷ c_k) against **measured**: the speedup is that ratio, up to the
#   prefills, which speculation does not change, and the machine's noise.
#
# ## Measure it: an edit-style workload (~5 min)
#
# The case prompt lookup was made for: the output repeats much of the prompt. Here each prompt
# holds a function and the start of its renamed copy, the way a "rename this function" edit
# begins. A large model copies the rest line by line. `tiny` (a few million parameters) copies
# poorly, so watch α: whatever it repeats, of the prompt or of its own output, prompt lookup gets for free.

# %%
functions = [
    ("def count_words(text):\n    counts = {}\n    for word in text.split():\n"
     "        counts[word] = counts.get(word, 0) + 1\n    return counts\n", "count_words", "word_counts"),
    ("def read_config(path):\n    config = {}\n    with open(path) as f:\n        for line in f:\n"
     "            key, value = line.split('=')\n            config[key.strip()] = value.strip()\n    return config\n",
     "read_config", "load_config"),
    ("class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n\n    def norm(self):\n"
     "        return (self.x ** 2 + self.y ** 2) ** 0.5\n", "Point", "Vector"),
]
edit_texts = [f"{source}\n\n# {old} renamed to {new}\n" + "\n".join(source.replace(old, new).split("\n")[:2])
              for source, old, new in functions]
edit = [target_llm.tokenizer.encode(t) for t in edit_texts]
edit_plain = run(None, edit, greedy, repeats=REPEATS)
edit_runs = {name: run(make(4), edit, greedy, repeats=REPEATS) for name, make in proposers().items()}
print(f"{'proposer, k = 4':>18} {'α':>6} {'tok/fwd':>8} {'speedup':>8}")
for name, r in edit_runs.items():
    if r:
        print(f"{name:>18} {r['stats'].acceptance_rate:6.3f} {r['stats'].tokens_per_forward:8.2f} "
              f"{r['tok/s'] / edit_plain['tok/s']:7.2f}x")
print("\nwhat tiny writes after the first prompt:\n" + target_llm.tokenizer.decode(edit_plain["outputs"][0]))

# %% [markdown]
# Prompt lookup costs nothing to propose, so whatever it gets right is nearly pure gain; a draft
# model pays k of its own forwards whether it is right or not. On text that repeats, the free
# proposer competes with the trained one even at a lower α. Production engines pair them: prompt
# lookup for retrieval, code editing and agents re-reading their tool output; a draft or heads for
# everything else.
#
# ## Measure it: where speculation stops paying (~5 min)
#
# Two ways to lose:
#
# * **Low acceptance.** Sampling at temperature 1 makes the target less predictable, and random
#   prompts give prompt lookup nothing to find. Every rejected proposal was paid for (k positions
#   verified, k draft forwards) and bought nothing.
# * **Big batches.** Speculation turns idle arithmetic into tokens. A batch of many sequences has
#   no idle arithmetic left: each step already computes a token for each of them, and verifying k
#   more for each multiplies the step's work. On a GPU this point comes at a large batch (lab 00's
#   ridge point says where); on a CPU much sooner. Where on yours? The next cells measure it.

# %%
sampled = SamplingParams(max_tokens=40, temperature=1.0, seed=0, ignore_eos=True)
gen = torch.Generator().manual_seed(5)
noise = [torch.randint(1, target_llm.model.config.vocab_size, (12,), generator=gen).tolist() for _ in range(4)]
methods = {"prompt lookup": "ngram", "pico draft": "draft"}
print(f"{'workload':>28} {'proposer, k = 4':>16} {'α':>6} {'speedup':>8}")
for label, prompts, params in (("code, greedy", code, greedy), ("code, sampled at T = 1", code, sampled),
                               ("random-token prompts, T = 1", noise, sampled)):
    base = plain if params is greedy else run(None, prompts, params, repeats=REPEATS)  # greedy: measured above
    for name, method in methods.items():
        r = sweep[name][4] if params is greedy else run(SpeculativeConfig(method, k=4), prompts, params,
                                                        repeats=REPEATS)
        print(f"{label:>28} {name:>16} {r['stats'].acceptance_rate:6.3f} {r['tok/s'] / base['tok/s']:7.2f}x")

# %%
batch_prompts = [target_llm.tokenizer.encode(f"# task {i}\n" + code_texts[i % len(code_texts)]) for i in range(16)]
batches = [1, 4] if QUICK else [1, 4, 16]
scaling = {}
for batch in batches:
    base = run(None, batch_prompts[:max(batch, 4)], greedy, batch=batch, repeats=1)
    scaling[batch] = {name: run(SpeculativeConfig(method, k=4), batch_prompts[:max(batch, 4)], greedy, batch=batch,
                                repeats=1)["tok/s"] / base["tok/s"]
                      for name, method in methods.items()}
    print(f"batch {batch:2d}: plain {base['tok/s']:5.0f} tok/s; speedup at k = 4: "
          + ", ".join(f"{name} {x:.2f}x" for name, x in scaling[batch].items()))
fig = go.Figure([go.Scatter(x=batches, y=[scaling[b][name] for b in batches], mode="markers+lines", name=name)
                 for name in methods])
fig.add_hline(y=1.0, line_dash="dot")
fig.update_layout(title="Speedup of speculation (k = 4) against batch size, greedy code prompts",
                  xaxis_title="sequences per step", yaxis_title="tokens/s, with ÷ without", height=320)
fig.update_xaxes(type="log", tickvals=batches)
fig.show()

# %% [markdown]
# At batch 1 each step reads all the weights to compute a single token, and speculation fills the
# step with more useful work. As the batch grows the step is already full: the extra positions cost
# nearly their full price, and rejected ones are pure loss. This is why engines cap or switch off
# speculation under load, and why the proposer's cost matters as much as its α.
#
# ## Measure it: on a real model (~20 min)
#
# Everything above ran on `tiny`, whose 23 MB of weights (in float32) fit in a CPU's caches, and
# which copies text poorly. **SmolLM2-135M-Instruct** is a trained chat model: 30 layers, 135M parameters, 540 MB
# in float32. Two things change with it.
#
# * **α.** Asked to fix the spelling in a paragraph, an instruct model writes the paragraph again,
#   mostly as it was. Each time it is copying, the last few tokens it wrote also occur in the prompt,
#   and what followed them there is what it writes next: prompt lookup's proposals come true in runs.
#   (At 135M parameters it is not a reliable editor: it drops or repeats a sentence now and then,
#   and it rewrites code rather than copying it, which is why the task is prose. Read its answers
#   below; whatever it copies, prompt lookup gets.)
# * **c_k.** Each decode step now streams all 540 MB of weights from memory, the regime lab 00
#   calls memory-bound, and the k extra rows a verification computes share that one read. The
#   arithmetic of those rows is not free on a CPU, so expect `c_k` above 1; the table shows how far.
#
# The requests go through the model's chat template (`llm.chat_template.render(messages)`, what
# `LLM.chat` does), greedily and one at a time, with your `propose_ngram` and your `verify` inside
# the engine. Greedy output must be token for token what the model writes without speculation.
# First the plain run and prompt lookup at k = 1, which measures α; then you predict k = 4 from it.
# If the model is not installed the cells tell you how to install it and skip.

# %%
from minillm.labkit import REAL_MODEL, real_model_installed

REAL = REAL_MODEL
real_installed = real_model_installed()
if real_installed:
    typo_texts = ["The quick brown fox jumpd over the lazy dog. It was a sunny day and the fox was very hapy. "
                  "The dog did not mind at all, becaus it was sleeping under a big tree near the river.",
                  "Our team met on Monday to discus the new project. We agreed to finsh the first version by "
                  "the end of the month, and to test it with a few custmers before the release."]
    real_llm = LLM(REAL, num_kv_blocks=8)  # for its chat template and tokenizer; the runs load their own
    fix_prompts = [real_llm.chat_template.render(
        [{"role": "user", "content": f"Fix the spelling mistakes in this text and change nothing else:\n\n{t}"}])
        for t in typo_texts]
    if QUICK:  # under the test suite: one request, fewer tokens, the same method
        typo_texts, fix_prompts = typo_texts[:1], fix_prompts[:1]
    real_greedy = SamplingParams(max_tokens=24 if QUICK else 48, temperature=0)
    real_plain = run(None, fix_prompts, real_greedy, repeats=1, model=REAL, num_kv_blocks=64)
    real_runs = {1: run(SpeculativeConfig("ngram", k=1), fix_prompts, real_greedy, repeats=1, model=REAL,
                        num_kv_blocks=64)}
    for text, out in zip(typo_texts, real_plain["outputs"]):
        print(f"asked to fix: {text}\nit wrote:     {real_llm.tokenizer.decode(out)}\n")
    alpha_1 = real_runs[1]["stats"].acceptance_rate
    print(f"prompt lookup at k = 1: α = {alpha_1:.3f}, "
          f"tokens per forward {real_runs[1]['stats'].tokens_per_forward:.2f}")

# %% [markdown]
# **Predict.** Take the α just printed as every proposal's chance of being kept. What does your 5.5
# give for tokens per forward at k = 4? Will the measurement come out above or below it: does this
# model copy in long runs, or token by token? Write the number down before you run the next cell.

# %%
MY_PREDICTION = None  # tokens per forward of prompt lookup at k = 4 on the typo fixes: 5.5 at the α above

# %%
if real_installed:
    real_k = [1, 4] if QUICK else [1, 2, 4]
    for k in real_k[1:]:
        real_runs[k] = run(SpeculativeConfig("ngram", k=k), fix_prompts, real_greedy, repeats=1, model=REAL,
                           num_kv_blocks=64)
    print("greedy outputs identical to no speculation:",
          all(r["outputs"] == real_plain["outputs"] for r in real_runs.values()))
    print(f"without speculation: {real_plain['tok/s']:.1f} tok/s, a decode step {real_plain['step'] * 1e3:.0f} ms "
          f"(tiny: {plain['step'] * 1e3:.1f} ms)\n")
    print(f"{'k':>2} {'α':>6} {'tok/fwd':>8} {'theory':>7} {'c_k':>5} {'predicted':>10} {'measured':>9}")
    for k, r in real_runs.items():
        s = r["stats"]
        cost = r["step"] / real_plain["step"]
        print(f"{k:2d} {s.acceptance_rate:6.3f} {s.tokens_per_forward:8.2f} "
              f"{expected_tokens_per_forward(s.acceptance_rate, k):7.2f} {cost:5.2f} "
              f"{s.tokens_per_forward / cost:9.2f}x {r['tok/s'] / real_plain['tok/s']:8.2f}x")
    print()
    compare(f"prompt lookup on {REAL}, k = 4: tokens per forward", MY_PREDICTION,
            theory=expected_tokens_per_forward(alpha_1, 4), measured=real_runs[4]["stats"].tokens_per_forward,
            unit="tokens/forward", theory_name=f"5.5 at k = 1's α = {alpha_1:.2f}",
            gap="a ratio above 1 says the kept proposals came in runs (copied phrases), not one by one, "
                "as the formula assumes; the table's theory column redoes it with k = 4's own α")
    pairs = {"tiny, its edit prompts": (edit_runs["prompt lookup"], edit_plain),
             f"{REAL}, typo fixes": (real_runs[4], real_plain)}
    print("\nprompt lookup at k = 4 on both models:")
    for name, (r, base) in pairs.items():
        print(f"{name:>40}: α {r['stats'].acceptance_rate:.3f}, tok/fwd {r['stats'].tokens_per_forward:.2f}, "
              f"c_k {r['step'] / base['step']:.2f}, speedup {r['tok/s'] / base['tok/s']:.2f}x")
    fig = make_subplots(rows=1, cols=2, subplot_titles=(f"{REAL}: tokens/s, greedy, batch 1",
                                                        "prompt lookup at k = 4: speedup on each model"))
    fig.add_trace(go.Bar(x=["none"] + [f"k = {k}" for k in real_k],
                         y=[real_plain["tok/s"]] + [real_runs[k]["tok/s"] for k in real_k],
                         marker_color=["#9aa5b1"] + ["#3d6fb6"] * len(real_k), showlegend=False), row=1, col=1)
    fig.add_trace(go.Bar(x=list(pairs), y=[r["tok/s"] / base["tok/s"] for r, base in pairs.values()],
                         marker_color=["#9aa5b1", "#3d6fb6"], showlegend=False), row=1, col=2)
    fig.add_hline(y=1.0, line_dash="dot", row=1, col=2)
    fig.update_yaxes(title_text="tokens/s", row=1, col=1)
    fig.update_yaxes(title_text="tokens/s, with ÷ without", row=1, col=2)
    fig.update_layout(height=360, title=f"Prompt lookup on {REAL}: an instruct model asked to edit text")
    fig.show()

# %% [markdown]
# Read it as before: tokens per forward follows from α (where it departs from the theory, the
# accepted proposals came in runs, not independently), the speedup is tokens per forward divided by
# `c_k`, and greedy output is unchanged. The two lines above put the same proposer, with the same k,
# on both models: read off which factor moved, α (how much the model copies) or `c_k` (what the
# extra rows cost when each step has 540 MB of weights to read rather than 23 MB from the caches).
# On a shared CPU, `c_k` and the speedup move from run to run while α and tokens per forward do not
# (greedy output is the same every time): run the two cells again before you conclude. On a GPU,
# where verifying a few rows costs about one decode step, the same tokens per forward would be
# nearly all speedup.
#
# ### A proposer that models the text: the model's own weights, quantized
#
# Prompt lookup pays only where the answer copies its prompt; for an ordinary chat answer, a proposer
# has to predict the text. The cheapest model that agrees with SmolLM2 is SmolLM2 itself with fewer
# bits: its layers in int4 (a scale and a minimum per 32 weights, the shape of the GGUF file's own
# Q4_1 blocks) and its LM head in int8. Each of its forwards reads about a fifth of the bytes of a
# float32 one. It is a draft like any other (`method="draft"`, `draft_model="self"`), with one
# shortcut: it has the target's layers and shapes, so the engine hands it the target's K/V of every
# token the target has computed, and it never computes a prompt.
#
# **Predict.** α should be near 1 (the same model, rounded), so tokens per forward near k + 1. The
# speedup is then decided by cost alone: k draft forwards (each a fraction of a step, but not the
# fifth the bytes suggest: the norms, the attention and the engine's own work cost what they cost
# the target) plus one verifying forward of k + 1 rows (prompt lookup's `c_k` at k = 4 above).
# Here `c_k` is a whole round's cost, the draft's forwards included, against one plain step. Guess
# a draft forward's share of a step, add up the round, and divide.

# %%
MY_SELF_DRAFT_PREDICTION = None  # speedup (×) of the int4 self draft at k = 4 on chat: tokens per forward ÷ c_k

# %%
from minillm import QuantConfig

if real_installed:
    questions = ["Explain in a few sentences why the sky is blue.", "Give three tips for writing a clear email."]
    chat = [real_llm.chat_template.render([{"role": "user", "content": q}]) for q in questions[:1 if QUICK else 2]]
    self_draft = SpeculativeConfig("draft", k=4, draft_model="self",
                                   draft_quantization=QuantConfig("int4", group_size=32, int4_range="min-max"),
                                   draft_head_quantization=QuantConfig("int8"))
    chat_plain = run(None, chat, real_greedy, repeats=1, model=REAL, num_kv_blocks=64)
    chat_self = run(self_draft, chat, real_greedy, repeats=1, model=REAL, num_kv_blocks=64)
    s, cost = chat_self["stats"], chat_self["step"] / chat_plain["step"]
    print("greedy outputs identical to no speculation:", chat_self["outputs"] == chat_plain["outputs"])
    print(f"self draft, k = 4, chat: α {s.acceptance_rate:.3f}, tok/fwd {s.tokens_per_forward:.2f} (theory "
          f"{expected_tokens_per_forward(s.acceptance_rate, 4):.2f}), c_k {cost:.2f}\n")
    compare("int4 self draft on chat, k = 4: speedup", MY_SELF_DRAFT_PREDICTION,
            theory=expected_tokens_per_forward(s.acceptance_rate, 4) / cost,
            measured=chat_self["tok/s"] / chat_plain["tok/s"], unit="x",
            theory_name="5.5 at the measured α, ÷ the measured c_k",
            gap="the measurement includes the prefill, which speculation does not speed up, and runs that "
                "accepted less than independence predicts; on a shared CPU c_k moves from run to run")

# %% [markdown]
# Your figures move with your machine and its load; α and tokens per forward do not. For a second
# machine's view, the benchmark record `docs/benchmarks/spec-smollm2.json` (`python -m minillm.bench
# spec --model smollm2-135m-instruct`) holds the same proposers on chat prompts; the next cell prints
# it with the machine it ran on.

# %%
import json
from pathlib import Path

import minillm

record_path = Path(minillm.__file__).resolve().parents[1] / "docs" / "benchmarks" / "spec-smollm2.json"
if record_path.is_file():
    record = json.loads(record_path.read_text())
    print(f"{record_path.name}: {record['machine']}, {record['date'][:10]}")
    for row in record["batch1_greedy"]["chat"]:
        print(f"  chat, {row['proposer']:>38}, k = {row['k']}: α {row['alpha']:.3f}, "
              f"tok/fwd {row['tokens_per_forward']:.2f} (theory {row['theory']:.2f}), speedup {row['speedup']:.2f}x")
else:
    print("(no benchmark record here: docs/benchmarks/ is in the repository, not in an installed package)")

# %% [markdown]
# Two experiments: `k=6` (more tokens per round; does `c_k` grow by less?), and
# `draft_head_quantization=None`, a float32 head: watch α and the speedup, knowing that each draft
# forward then streams the LM head's 49152 × 576 weights in 4 bytes each instead of 1. Which moved,
# α or `c_k`?
#
# ## Distill a draft yourself (~15 min)
#
# Back to `tiny` and `pico`. Your 5.6 loss now trains: pico (the student) learns tiny's (the
# teacher's) distributions on **tiny's own greedy outputs**, which is exactly the text a draft sees
# when it drafts for greedy tiny. The data: short windows of `minillm`'s own source code as prompts,
# and tiny's greedy continuation of each; the held-out prompts come from other files.
#
# Two measurements before and after, each with its theory line:
#
# * the draft's **greedy agreement** with tiny over held-out positions of tiny's own text, measured
#   with no engine at all: at temperature 0 a proposal is kept exactly when the two argmaxes agree,
#   so this is the acceptance rate the engine should see;
# * the engine's **α and tokens per forward** at k = 4, greedy, with your 5.5 beside them.
#
# The run is short (a learner's run: a few minutes on a CPU; under the test suite a few steps), so
# the gain is smaller than that of the bundled `pico-distilled`, trained by `python -m minillm train
# distill` for longer on the whole corpus; it is measured as well.

# %%
import shutil
import tempfile

from minillm.models.export import save_checkpoint
from minillm.models.prepare import load_model
from minillm.models.registry import resolve_model_path
from minillm.training.train_draft import draft_agreement, logits_of

package = Path(minillm.__file__).resolve().parent


def windows(folder: str, count: int, seed: int, length: int = 16) -> list[list[int]]:
    """`count` windows of `length` tiny tokens from the Python files of minillm/<folder>, at seeded places."""
    ids = target_llm.tokenizer.encode("\n".join(f.read_text() for f in sorted((package / folder).glob("*.py"))))
    starts = torch.randint(0, len(ids) - length, (count,), generator=torch.Generator().manual_seed(seed)).tolist()
    return [ids[s:s + length] for s in starts]


STEPS, ROWS = (12, 48) if QUICK else (300, 512)
writer = LLM("tiny", max_num_seqs=64)
train_prompts, held_prompts = windows("engine", ROWS, 0), windows("cache", 8 if QUICK else 24, 1)
continuation = SamplingParams(max_tokens=48, temperature=0, ignore_eos=True)
train_rows = torch.tensor([p + o.token_ids for p, o in zip(train_prompts, writer.generate(train_prompts, continuation,
                                                                                       use_tqdm=False))])
held_rows = torch.tensor([p + o.token_ids for p, o in zip(held_prompts, writer.generate(held_prompts, continuation,
                                                                                     use_tqdm=False))])
teacher = load_model(resolve_model_path("tiny"), torch.float32, torch.device("cpu")).requires_grad_(False).eval()
student = load_model(resolve_model_path("pico"), torch.float32, torch.device("cpu"))
print(f"training rows {tuple(train_rows.shape)}, held-out rows {tuple(held_rows.shape)} (tokens of tiny's own text); "
      f"student {sum(p.numel() for p in student.parameters()):,} parameters, teacher "
      f"{sum(p.numel() for p in teacher.parameters()):,}")


def engine_acceptance(draft: str) -> dict:
    """The engine (tiny, your verifier, `draft` proposing at k = 4) on the held-out prompts, greedy."""
    return run(SpeculativeConfig("draft", k=4, draft_model=draft), held_prompts, continuation, repeats=1)["stats"]


before = {"agreement": draft_agreement(student, teacher, held_rows)["greedy_agreement"],
          "engine": engine_acceptance("pico")}
print(f"pico before: greedy agreement {before['agreement']:.3f}, engine α {before['engine'].acceptance_rate:.3f}")

# %% [markdown]
# **Predict.** After the run, will the engine's α rise by a few hundredths or by a tenth? The
# bundled `pico-distilled` had many more steps on more text; yours sees only tiny's own outputs,
# the text it will draft on. Then turn your α into tokens per forward at k = 4 with 5.5.

# %%
MY_DISTILLED_PREDICTION = None  # tokens per forward at k = 4 of your distilled pico, greedy, on the held-out prompts

# %%
optimizer = torch.optim.AdamW(student.parameters(), lr=3e-4)
gen, curve, start = torch.Generator().manual_seed(0), [], time.perf_counter()
student.train()
for _ in range(STEPS):
    batch = train_rows[torch.randint(len(train_rows), (8,), generator=gen)]  # [8, 64] token ids
    with torch.no_grad():
        teacher_logits_batch = logits_of(teacher, batch)  # [8 * 64, vocab]
    loss = distill_loss(logits_of(student, batch), teacher_logits_batch)  # your 5.6
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    curve.append(loss.item())
student.eval()
print(f"{STEPS} steps in {time.perf_counter() - start:.0f} s; distillation loss {curve[0]:.3f} -> {curve[-1]:.3f} nats")

mine = Path(tempfile.mkdtemp()) / "pico-yours"
save_checkpoint(student, student.config, json.loads((resolve_model_path("pico") / "config.json").read_text()), mine)
shutil.copyfile(resolve_model_path("tiny") / "tokenizer.json", mine / "tokenizer.json")
after = {"agreement": draft_agreement(student, teacher, held_rows)["greedy_agreement"],
         "engine": engine_acceptance(str(mine))}
bundled = engine_acceptance("pico-distilled") if (BUNDLED_DIR / "pico-distilled" / "config.json").is_file() else None
print(f"{'draft':>16} {'agreement':>10} {'α':>6} {'tok/fwd':>8} {'theory':>7}")
for name, agreement, st in (("pico", before["agreement"], before["engine"]),
                            ("yours", after["agreement"], after["engine"]),
                            ("pico-distilled", float("nan"), bundled)):
    if st is not None:
        print(f"{name:>16} {agreement:10.3f} {st.acceptance_rate:6.3f} {st.tokens_per_forward:8.2f} "
              f"{expected_tokens_per_forward(st.acceptance_rate, 4):7.2f}")
print()
compare("your distilled pico, k = 4: tokens per forward", MY_DISTILLED_PREDICTION,
        theory=expected_tokens_per_forward(after["agreement"], 4), measured=after["engine"].tokens_per_forward,
        unit="tokens/forward", theory_name=f"5.5 at its offline greedy agreement {after['agreement']:.2f}",
        gap="the agreement is counted over every held-out position, α only over the proposals the engine reached "
            "(after a rejection it stops), where the text is easier or harder than average")
shutil.rmtree(mine.parent, ignore_errors=True)
fig = go.Figure(go.Scatter(y=curve, mode="lines"))
fig.update_layout(title="Your distillation of pico toward tiny", xaxis_title="step",
                  yaxis_title="KL(tiny ‖ pico), nats (your 5.6)", height=300)
fig.show()

# %% [markdown]
# The loss falls on the training rows; what matters is whether α rose on prompts the draft never
# saw. If it barely moved, the run was too short or too narrow: try more steps or rows (each step
# costs a pico forward and backward and a tiny forward), or a temperature above 1 in your loss. If
# the loss fell and α did not, the student learned its training rows, not tiny.
#
# ## How production engines do it (~5 min)
#
# * **vLLM** takes a `speculative_config`: a `method` (a separate draft model, `ngram` prompt lookup
#   with a range of n-gram lengths, EAGLE and EAGLE-3 heads, Medusa heads, a model's own MTP layers,
#   suffix decoding) and `num_speculative_tokens` (our k). Its V1 scheduler treats proposals as just
#   more tokens for a request to compute in the step, as `minillm`'s does, and its rejection sampler
#   runs on the GPU for the whole batch at once. Acceptance counts per position are exported as
#   metrics, the numbers you read above.
# * **EAGLE** (Li et al. 2024) drafts with a single transformer layer that reads the target's own
#   last hidden states (and token embeddings), so it predicts features, not just tokens; EAGLE-2 and
#   EAGLE-3 grow a *tree* of candidates whose shape adapts to the draft's confidence. **SGLang**
#   made EAGLE its main speculative path, with CUDA graphs for the draft and the tree.
# * **Medusa** (Cai et al. 2024) adds k heads on the last hidden state, each guessing one position
#   further ahead, exactly the `heads` proposer of `minillm`; because its guesses for different
#   positions are independent, it proposes the top few tokens per position and verifies the
#   combinations as a tree.
# * **Tree attention** verifies many candidate continuations in one forward: the candidates share
#   their prefixes as a token tree, and the attention mask lets each node see only its ancestors.
#   The verifier keeps the longest accepted path (SpecInfer, Medusa, EAGLE-2).
# * **DeepSeek-V3's multi-token prediction** trains the model itself with extra sequential MTP
#   modules that predict further tokens; at inference the module drafts the next token, which its
#   report says is accepted 85 to 90% of the time, close to doubling decode speed.
# * **Draft models** in production share the target's tokenizer, are often distilled from it, and
#   are 10 to 100 times smaller; the draft's own KV cache has to be rolled back with the target's,
#   as `minillm/speculative/draft.py` does.
