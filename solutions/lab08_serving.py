# %% [markdown]
# # Lab 08 · Serving
#
# **Time:** about 125 minutes (each section's heading gives its share). **You need:** lab 02 (TTFT
# and TPOT of one request), lab 04 (continuous batching: why one more request slows the others) and
# lab 00 (what a step costs). **See also:** the visualizer's **Serving** page (`make app`), which
# drives the same server and load generator with sliders, and `docs/serving.md`.
#
# An engine turns prompts into tokens; a **service** turns HTTP requests from many users into
# streamed answers, on time, at a price, without falling over when too many arrive. This lab is
# about that layer. `minillm` has an OpenAI-compatible server (`minillm/serve/app.py`), a load
# generator in the style of vLLM's serving benchmark (`minillm/serve/loadgen.py`), structured
# output (`minillm/structured/`) and an agent harness (`minillm/agents/`). You write eight of
# their parts, each with the engine's signature, and then run **your** parts inside them. The main
# experiment puts the real chat model, SmolLM2-135M-Instruct, behind the server: you predict its
# capacity and the price of a token from step costs you measure, then measure both.
#
# | exercise | your part | runs inside |
# | --- | --- | --- |
# | 8.1 | `parse_sse`: the streaming wire format | the load generator |
# | 8.2 | `request_metrics`: TTFT, TPOT, ITL, E2E | the load test's report |
# | 8.3 | `percentile`, `goodput`: the figures a service promises | the load test's report |
# | 8.4 | `arrival_times`: when users send requests | the load generator |
# | 8.5 | `admit`: 429 and Retry-After when the queue is full | the server |
# | 8.6 | `apply_grammar_mask`: tokens a JSON schema allows | the engine |
# | 8.7 | `cost_per_million_tokens`: what a token costs | the cost experiment |
# | 8.8 | `LoopBreaker`: stop an agent that loops | the agent harness |
#
# ## Learning objectives
# By the end you can
# 1. read a streamed completion off the wire (server-sent events) and time each token as it arrives;
# 2. define TTFT, TPOT, ITL and E2E exactly, report their percentiles, and say what goodput adds;
# 3. generate open-loop load (Poisson and bursty arrivals), predict a server's capacity from its step
#    costs, and measure its latency–throughput curve and goodput;
# 4. protect a server with admission control, and tell clients when to come back;
# 5. constrain generation to a JSON schema with a token bitmask, inside batching;
# 6. price a token, online and in batch, from your own measurements;
# 7. stop a runaway agent, and see what offloading its KV cache between calls buys.
#
# ## How this lab works
# Write code only in the exercise cells (they contain `raise NotImplementedError`), keeping names
# and signatures. Run each `check(...)` cell for feedback. `make grade LAB=08` grades the notebook,
# and like `check("8.E")` near the end it runs your parts **inside the real engine, server, load
# generator and agent harness** and compares what they do with the reference parts.
# The engine's versions are in `minillm/serve/sse.py`, `minillm/perf/serving.py`,
# `minillm/serve/arrivals.py`, `minillm/serve/admission.py`, `minillm/structured/mask.py`,
# `minillm/perf/cost.py` and `minillm/agents/breaker.py`: read them after you finish.

# %% tags=["setup"]
import json
import math
from collections import Counter, deque
from collections.abc import Iterable, Iterator

import numpy as np
import torch
from torch import Tensor

from minillm.agents.breaker import normalise
from minillm.labkit import check
from minillm.perf.serving import SLO_METRICS, RequestMetrics, RequestRecord

# %%
import asyncio
from concurrent.futures import ThreadPoolExecutor

import httpx
import plotly.graph_objects as go

from minillm import LLM, SamplingParams
from minillm.agents.harness import run_sessions
from minillm.agents.sessions import agent_workload
from minillm.config import Components
from minillm.perf.cost import DEFAULT_PRICE_PER_HOUR
from minillm.serve.loadgen import run_load
from minillm.serve.server import serve_in_thread
from minillm.serve.load_prompts import make_workload
from minillm.structured import StructuredOutput

torch.set_num_threads(1)  # a small model on a shared CPU: one thread avoids fighting over the cores

# %% [markdown]
# ## A request's life in a server (~5 min)
#
# A client sends `POST /v1/completions` with `"stream": true`. The server queues the prompt in the
# engine (lab 04's scheduler takes it when there is room), and from the step that computes its
# first token on, every step's new text goes out at once, as a **chunk**. The client sees:
#
# ```
# request sent ──queue──prefill──▶ chunk 1 ──decode──▶ chunk 2 ──▶ … ──▶ chunk m ──▶ [DONE]
#      start                          c_1                c_2              c_m        end
# ```
#
# Everything a user feels is in those times: how long until something appears (**TTFT**), how
# fast the text flows after that (**TPOT**, **ITL**), and the whole wait (**E2E**). A load test
# records them for every request, from the client's side, because that is where the user sits.
#
# The chunks travel as **server-sent events** (SSE), a plain-text format over one HTTP response:
# each event is one or more `data:` lines, and a blank line ends it. OpenAI's API, vLLM and
# SGLang all stream this way, and end the stream with the event `data: [DONE]`. Here is a real
# stream from the bundled `tiny` model, served in this process (the server binds 127.0.0.1 on a
# free port):

# %%
llm = LLM("tiny", max_num_seqs=8)
server = serve_in_thread(llm)

body = {"model": "tiny", "prompt": "def add(a, b):", "max_tokens": 4, "temperature": 0, "stream": True}
with httpx.stream("POST", server.base_url + "/v1/completions", json=body, timeout=60) as response:
    raw = list(response.iter_lines())
for line in raw[:6]:
    print(repr(line))
print("...", len(raw), "lines in all; the last:", repr(raw[-2]))

# %% [markdown]
# ## Exercise 8.1 · Parse server-sent events (~12 min)
#
# The rules you need (the WHATWG HTML standard defines the format):
#
# * lines end in `\n`, `\r\n` or `\r`; an item of `lines` may hold several lines, or one line
#   without its ending (what `httpx`'s `iter_lines` gives);
# * `data: <text>` adds a line to the event's data: the text after `data:`, without **one**
#   leading space if there is one; an event's several data lines are joined with `"\n"`;
# * a blank line ends the event; a line starting with `:` is a comment (servers send them to keep
#   a connection alive); other fields (`event:`, `id:`, `retry:`) carry nothing we need: skip them;
# * a payload is JSON, except OpenAI's end marker `[DONE]` (yield the string itself), and text
#   that is not JSON (yield it as a string);
# * when the lines run out while an event is still open (no blank line after it), yield it too: a
#   stream cut short should not lose its last chunk.

# %% exercise="8.1"
def parse_sse(lines: Iterable[str]) -> Iterator[dict | str]:
    """Decode SSE lines into the payloads of their events, in order (a generator).

    lines: str items, each one line (with or without its line ending) or several lines, as the rules
    above say. Yields one item per event that has data: the decoded JSON value (a dict), the string
    "[DONE]" for the end marker, or the event's data as a str when it is not JSON. Events without data
    lines (only comments, or other fields) yield nothing; a last event left open when the lines run
    out is yielded too. Reads `lines` once, lazily (a generator of lines works).
    """
    ### BEGIN SOLUTION
    import re
    data: list[str] = []

    def decode(payload: str) -> dict | str:
        if payload == "[DONE]":
            return payload
        try:
            return json.loads(payload)
        except json.JSONDecodeError:
            return payload

    for item in lines:
        pieces = re.split(r"\r\n|\r|\n", item)
        if len(pieces) > 1 and pieces[-1] == "":
            pieces.pop()
        for line in pieces:
            if line == "":
                if data:
                    yield decode("\n".join(data))
                data = []
            elif not line.startswith(":"):
                field, _, value = line.partition(":")
                if field == "data":
                    data.append(value[1:] if value.startswith(" ") else value)
    if data:
        yield decode("\n".join(data))
    ### END SOLUTION


# %% [markdown]
# <details><summary>Hint 1: a nudge</summary>
#
# Work in two layers: first turn the items into single lines (an item may hold several, and an item's own
# final line ending must not make an extra blank line), then feed each line to a tiny state machine whose
# only state is the data lines of the event still open.
# </details>
# <details><summary>Hint 2: the idea</summary>
#
# Only three kinds of line matter: blank (close the event: yield if it has data), a comment (skip) and a
# field. A field's name is what comes before the first colon; only `data` adds to the event. Python's
# `str.splitlines` breaks at more characters than SSE does (form feeds, Unicode separators): split on the
# three SSE endings only. After the loop, an event still open is yielded too.
# </details>
# <details><summary>Hint 3: last resort</summary>
#
# A regular expression that splits on `\r\n`, `\r` or `\n` (in that order of alternatives), dropping the
# empty piece after an item's final ending; strip exactly one leading space from a data value; decode with
# `json`, keeping `[DONE]` and non-JSON text as strings.
# </details>

# %%
for payload in parse_sse(raw):
    print(payload if payload == "[DONE]" else payload["choices"][0]["text"].__repr__())

# %%
check("8.1")

# %% [markdown]
# ## Exercise 8.2 · TTFT, TPOT, ITL and E2E (~8 min)
#
# A `RequestRecord` (imported from `minillm.perf.serving`) holds what the load generator saw of one
# request: `start` (when it was sent), `chunk_times` (when each chunk with tokens arrived), `end`,
# `output_tokens` (the server's usage count) and `success`. The definitions, as in vLLM's serving
# benchmark, with chunks at `c_1 < … < c_m`:
#
# * **TTFT**: from sending to the first chunk; **E2E**: from sending to the end;
# * **ITL**: the gaps between consecutive chunks, one per pair of neighbours;
# * **TPOT**: the time *after* the first token, spread over the tokens that came *after* the first.
#
# Count carefully. A worked example on other numbers: a request sent at t = 4.0 s whose first chunk
# arrives at 4.3 s and which ends at 5.5 s, with 7 tokens: TTFT 0.3 s, E2E 1.5 s, and the 1.2 s after
# the first token carried the 6 tokens after the first: 0.2 s each. (With one token there is no such
# time: TPOT is `None`.) ITL has one gap per *chunk*, and
# TPOT one per *token*; they differ when a chunk carries several tokens (speculative decoding, or a
# token that completes a multi-byte character) and because the time from the last chunk to the end
# is in TPOT but in no ITL gap. Neither includes the TTFT: the first token's wait is queueing and
# prefill, a different cost with a different cure.

# %% exercise="8.2"
def request_metrics(record: RequestRecord) -> RequestMetrics:
    """TTFT, TPOT, ITL and E2E of one successful request, in seconds (floats), as defined above.

    record: start, chunk_times (m >= 1 floats, ascending, seconds on the clock of start), end,
    output_tokens (the server's count, which may exceed m), success.
    -> RequestMetrics(ttft, tpot, itl, e2e): itl a list of m - 1 gaps (empty for one chunk); tpot None
    when there is no token after the first. The record is not changed.
    Raises ValueError, naming the request, when it did not succeed or has no chunk time or no end.
    """
    ### BEGIN SOLUTION
    if not record.success or not record.chunk_times or record.end is None:
        raise ValueError(f"request {record.request_id!r} has no metrics: success={record.success}, "
                         f"{len(record.chunk_times)} chunk times, end={record.end}")
    ttft = record.chunk_times[0] - record.start
    e2e = record.end - record.start
    itl = [b - a for a, b in zip(record.chunk_times, record.chunk_times[1:])]
    tpot = (e2e - ttft) / (record.output_tokens - 1) if record.output_tokens > 1 else None
    return RequestMetrics(ttft, tpot, itl, e2e)
    ### END SOLUTION


# %%
example = RequestRecord("r0", start=10.0, chunk_times=[10.5, 10.6, 10.75, 10.8], end=10.9, output_tokens=5,
                        success=True)
print(request_metrics(example))  # work out the four figures by hand first: E2E should be 0.9

# %% [markdown]
# <details><summary>Hint 1: a nudge</summary>
#
# Refuse the records that cannot have metrics first; then each figure is one line.
# </details>
# <details><summary>Hint 2: the idea</summary>
#
# ITL pairs each chunk time with the next one. TPOT divides a duration by a count of tokens: which tokens
# does the duration after the first chunk belong to? The worked example above has the answer's shape.
# </details>
# <details><summary>Hint 3: last resort</summary>
#
# TPOT is (E2E − TTFT) divided by one less than the output tokens, when that count is above zero.
# </details>

# %%
check("8.2")

# %% [markdown]
# ## Exercise 8.3 · Percentiles and goodput (~10 min)
#
# A service is judged on its **tail**: the p99 TTFT is what one request in a hundred is slower
# than. `percentile(values, q)` must agree with numpy's default ("linear"). Build it in steps:
#
# * sorted, n values sit at positions 0, 1, …, n − 1; q = 0 must give the smallest, q = 100 the largest;
#   so the percentile's position is some fraction of the way along those positions;
# * that position is rarely a whole number: then the answer lies on the straight line between the two
#   neighbours, as far from the lower one as the position's fractional part says.
#
# A worked example on other numbers: for the 5 values `[10, 20, 40, 80, 160]`, q = 0 is 10 and q = 100 is
# 160. The median (q = 50) falls at position 2, exactly on 40. q = 60 falls 60% of the way from position 0
# to position 4: at position 2.4, 40% of the way from 40 to 80, so 56. (A classic bug uses the count of
# values where the last position belongs: at q = 100 it runs past the end.)
#
# Throughput counts every finished request, however slow. **Goodput** (DistServe, Zhong et al.
# 2024) counts only the requests that met **every** service-level objective (SLO) at once, per
# second of the run. The `slo` dict names the limits that apply (`{"ttft": 0.5, "tpot": 0.05}`:
# E2E is free here). The rules: a value exactly at its limit meets it; a one-token request (TPOT
# `None`) meets any TPOT limit, as no token came after the first; a failed request never counts.
# For example, 30 requests in 10 s of which 21 met every limit: throughput 3 req/s, goodput 2.1.
# Use your `request_metrics` from 8.2.

# %% exercise="8.3"
def percentile(values: list[float], q: float) -> float:
    """The percentile q of values (q from 0 to 100; values: floats, any order, repeats allowed), a float equal
    to numpy.percentile's default ("linear") up to rounding: the smallest value at q = 0, the largest at
    q = 100. -> nan for no values. values is not changed (not even reordered).
    """
    ### BEGIN SOLUTION
    if not values:
        return math.nan
    xs = sorted(values)
    pos = q / 100 * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)
    ### END SOLUTION


def goodput(records: list[RequestRecord], duration: float, slo: dict[str, float]) -> float:
    """Goodput of a run: requests per second (a float) that succeeded and met every SLO in `slo`.

    records: the run's RequestRecords, failed ones included; duration: the run's length in seconds.
    slo: limits in seconds by metric name, any of "ttft", "tpot", "e2e" (SLO_METRICS); the rules of a
    limit met are those above (at the limit meets it; a None TPOT meets any limit). An empty slo: every
    successful request is good.
    Raises ValueError unless duration > 0 (0, negative or NaN: say the value), and for an unknown metric
    name (name it), whatever the records.
    """
    ### BEGIN SOLUTION
    if not duration > 0:
        raise ValueError(f"duration must be > 0 seconds, got {duration!r}")
    unknown = [name for name in slo if name not in SLO_METRICS]
    if unknown:
        raise ValueError(f"unknown SLO {unknown[0]!r}: the SLOs are {', '.join(SLO_METRICS)}")
    good = 0
    for record in records:
        if record.success:
            metrics = request_metrics(record)
            good += all(getattr(metrics, name) is None or getattr(metrics, name) <= limit
                        for name, limit in slo.items())
    return good / duration
    ### END SOLUTION


# %%
print("p50, p90, p99 of 1..10:", [percentile(list(range(1, 11)), q) for q in (50, 90, 99)])
slow = RequestRecord("r1", start=0.0, chunk_times=[2.0], end=2.2, output_tokens=3, success=True)
print("goodput of two requests over 4 s, TTFT <= 1 s:", goodput([example, slow], 4.0, {"ttft": 1.0}), "req/s")

# %% [markdown]
# <details><summary>Hint 1: a nudge</summary>
#
# For `percentile`, redo the worked example with n − 1 = 4 gaps between 5 positions: how far along is q = 60?
# For `goodput`, check the arguments before looking at a single record.
# </details>
# <details><summary>Hint 2: the idea</summary>
#
# The position is q/100 of the way along the positions 0 … n − 1; its whole part picks the lower neighbour,
# the next one is the upper (never past the last); the fractional part says how far between them. Goodput
# is a count of good records over the duration; a metric is read off the RequestMetrics by its name.
# </details>
# <details><summary>Hint 3: last resort</summary>
#
# position = q / 100 · (n − 1); lower = floor(position); upper = min(lower + 1, n − 1);
# result = xs[lower] + (xs[upper] − xs[lower]) · (position − lower).
# </details>

# %%
check("8.3")

# %% [markdown]
# ## Exercise 8.4 · When requests arrive (~8 min)
#
# A benchmark that sends the next request when the last one finishes (a **closed loop**) never
# overloads the server: it slows down with it. Users don't. An **open-loop** load test sends
# requests at times drawn in advance, whatever the server does. Many independent users make a
# **Poisson process**: the gaps between requests are exponential with mean `1 / rate`. Real
# traffic is often burstier (retries, agents fanning out, batch jobs). vLLM's benchmark models that
# with **gamma** gaps whose shape `k` is its `--burstiness`. Two facts about a gamma distribution of
# shape k and scale θ: its mean is k·θ and its coefficient of variation (spread over mean) is
# 1/√k. So k < 1 gives clumps and long pauses, k = 1 is exactly the exponential, and the scale is
# what you must choose so that the mean gap stays what the rate asks for. Worked on other numbers:
# gaps of mean 0.25 s with shape 4 need θ = 0.0625 s, and their CV is 0.5.
#
# The rules the engine's generator keeps, so that the same seed gives its arrivals exactly: numpy's
# seeded generator (`np.random.default_rng(seed)`), all n gaps drawn at once by its gamma method; the
# first request waits one gap too; `rate = inf` means everything at t = 0 (the offline, all-at-once
# load).

# %% exercise="8.4"
def arrival_times(n: int, rate: float, seed: int, burstiness: float = 1.0) -> list[float]:
    """Seconds after the start at which each of n requests is sent, ascending (a list of n floats).

    rate: requests per second on average (> 0; inf: all at once, n zeros); burstiness: the gamma shape
    (finite, > 0; 1 is Poisson). The gaps have the mean gap the rate asks for and the spread of that shape,
    drawn as the rules above say, so the same arguments give the engine's times exactly.
    Raises ValueError for n not an int >= 0, rate <= 0 or NaN, or burstiness not finite and > 0 (say the value).
    """
    ### BEGIN SOLUTION
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be an integer >= 0, got {n!r}")
    if not rate > 0:
        raise ValueError(f"rate must be > 0 requests/s (inf: all at once), got {rate!r}")
    if not (burstiness > 0 and math.isfinite(burstiness)):
        raise ValueError(f"burstiness must be a finite number > 0, got {burstiness!r}")
    if math.isinf(rate):
        return [0.0] * n
    gaps = np.random.default_rng(seed).gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n)
    return np.cumsum(gaps).tolist()
    ### END SOLUTION


# %%
fig = go.Figure()
for k, name in ((1.0, "Poisson (burstiness 1)"), (0.25, "bursty (burstiness 0.25)")):
    times = arrival_times(40, rate=4.0, seed=1, burstiness=k)
    fig.add_trace(go.Scatter(x=times, y=[name] * len(times), mode="markers", name=name))
fig.update_layout(title="40 requests at 4 requests/s on average", xaxis_title="seconds", height=240,
                  showlegend=False)
fig.show()

# %% [markdown]
# <details><summary>Hint 1: a nudge</summary>
#
# Check the arguments first (NaN compares false with everything: write the tests so that NaN fails them).
# Then: which scale gives a gamma of shape k the mean gap 1/rate?
# </details>
# <details><summary>Hint 2: the idea</summary>
#
# Solve k·θ = 1/rate for θ. Draw the n gaps in one call of the seeded generator, then each send time is the
# sum of the gaps up to and including its own.
# </details>
# <details><summary>Hint 3: last resort</summary>
#
# θ = 1 / (rate · k); the times are the running sum of the gaps, as a Python list.
# </details>

# %%
check("8.4")

# %% [markdown]
# ## Exercise 8.5 · Admission control: 429 and Retry-After (~6 min)
#
# A server has a capacity: past the rate at which it can finish requests (the **knee** of its
# latency–throughput curve, which you will measure on SmolLM2 below), a server that queues every
# request looks healthy while every request's TTFT grows without bound. Better to refuse early:
# admitted requests stay fast, and a refused client
# is told when to come back. HTTP has the words for it: status **429 Too Many Requests** with a
# **Retry-After** header in seconds (RFC 6585, RFC 9110).
#
# The server (`build_app(..., max_waiting=N, admission=fn)`) calls `admit(num_waiting,
# max_waiting, drain_rate)` for each new request: `num_waiting` requests already wait for the
# scheduler, and the queue drains at `drain_rate` requests per second lately. The rules it keeps:
#
# * a request that finds room in the queue (fewer than `max_waiting` waiting) is admitted;
# * a refused one is told how long it will take, at the recent drain rate, for enough of the waiting
#   requests to leave that **it** would find room;
# * the header carries whole seconds: round so that a client that obeys never comes back too early,
#   and never say less than 1 (a Retry-After of 0 invites an instant retry storm);
# * with no recent drain (`drain_rate` 0 or less) assume one request per second.
#
# A worked example on other numbers: room for 10, 10 waiting, draining 4 a second: the new request needs
# one request to leave before it fits, a quarter of a second, so it is told 1 s.

# %% exercise="8.5"
def admit(num_waiting: int, max_waiting: int, drain_rate: float) -> float | None:
    """None to admit the request, else the seconds to wait before retrying (a float holding a whole
    number >= 1), by the rules above.

    num_waiting, max_waiting: ints >= 0; drain_rate: requests per second (float; 0 or less: no recent drain).
    """
    ### BEGIN SOLUTION
    if num_waiting < max_waiting:
        return None
    excess = num_waiting - max_waiting + 1
    return float(max(1, math.ceil(excess / (drain_rate if drain_rate > 0 else 1.0))))
    ### END SOLUTION


# %%
for waiting, rate in ((3, 2.0), (4, 2.0), (9, 2.0), (9, 0.0), (9, 0.5)):
    print(f"{waiting} waiting (max 4), draining {rate} req/s: {admit(waiting, 4, rate)}")

# %% [markdown]
# <details><summary>Hint 1: a nudge</summary>
#
# Redo the worked example with 12 waiting instead of 10: how many requests must leave before the new one fits?
# </details>
# <details><summary>Hint 2: the idea</summary>
#
# The requests past the room, plus this one, must drain; time = that count / the rate. Which rounding never
# tells a client to come back before that time?
# </details>
# <details><summary>Hint 3: last resort</summary>
#
# max(1, ceil((num_waiting − max_waiting + 1) / rate)), rate 1.0 when drain_rate is not positive.
# </details>

# %%
check("8.5")

# %% [markdown]
# ## Exercise 8.6 · Structured output: the grammar mask (~10 min)
#
# Ask for `{"type": "object", "properties": {"n": {"type": "integer"}}}` and a model *usually*
# answers with JSON. A program needs *always*. Structured output makes it so: a grammar engine
# (here `xgrammar`, as in vLLM and SGLang) follows the tokens generated so far and, before each
# draw, says which tokens may come next. The engine then sets every other token's logit to `-inf`,
# so no sampler, greedy or random, can pick it.
#
# The allowed set comes as a **bitmask**: int32 words, 32 tokens per word, token `t` at bit `t % 32`
# of word `t // 32` (bit 0 is the lowest). A row of logits over `vocab` tokens gets
# `ceil(vocab / 32)` words (maybe more: ignore bits past the vocabulary). Mind bit 31: it is the
# **sign bit** of an int32. Token 31 of a word is allowed when the word is negative, and `>>` on a
# negative int32 shifts in ones from the left, so mask with `& 1` after shifting.
#
# The engine calls your function for the rows of constrained samples in every step, inside
# batches that also hold free requests (`EngineConfig(components=Components(grammar_mask=fn))`).
# Grammar engines fill the bitmask on the **CPU** while the logits may sit on an accelerator: whatever
# you build must live on the device of the tensor it meets (the grader runs your mask with the logits on
# PyTorch's `meta` device, which has no data, so a CPU tensor mixed in is an error even without a GPU).

# %% exercise="8.6"
def apply_grammar_mask(logits: Tensor, bitmask: Tensor) -> Tensor:
    """Keep the logits of allowed tokens, -inf elsewhere.

    logits: [rows, vocab] float (float32, float16 or bfloat16), on any device; bitmask: [rows, words]
    int32, words at least enough for vocab bits (bits past vocab are ignored), laid out as above, on the
    CPU or on logits' device. -> a new [rows, vocab] tensor of logits' dtype on logits' device: logits
    where allowed, -inf elsewhere. logits itself is left unchanged.
    """
    ### BEGIN SOLUTION
    vocab = logits.shape[-1]
    bits = torch.arange(32, device=bitmask.device, dtype=torch.int32)
    allowed = ((bitmask.unsqueeze(-1) >> bits) & 1).reshape(bitmask.shape[0], -1)[:, :vocab].bool()
    return logits.masked_fill(~allowed.to(logits.device), float("-inf"))
    ### END SOLUTION


# %%
words = torch.tensor([[0b1011, -2**31]], dtype=torch.int32)  # tokens 0, 1, 3 and 63 (word 1's sign bit)
print(apply_grammar_mask(torch.zeros(1, 64), words).isfinite().nonzero()[:, 1].tolist())

# %% [markdown]
# <details><summary>Hint 1: a nudge</summary>
#
# Turn each int32 word into its 32 bits at once (a shift by every bit position, broadcast), then you have one
# yes/no per token slot, row by row.
# </details>
# <details><summary>Hint 2: the idea</summary>
#
# Shift, then keep only the lowest bit (the sign bit's ones would spoil a test against zero); the bits of
# word w, position b, are token 32·w + b: flatten words and positions in that order and cut at vocab. Fill the
# forbidden slots of a copy, with the mask on the logits' device.
# </details>
# <details><summary>Hint 3: last resort</summary>
#
# `((bitmask[..., None] >> positions) & 1)` with positions 0 … 31 (int32, on the bitmask's device),
# reshaped to [rows, 32 · words], first vocab columns, as bool, moved to the logits' device; an out-of-place fill.
# </details>

# %%
check("8.6")

# %% [markdown]
# Your mask inside the engine: the same greedy requests through `tiny` with the engine's mask and
# with yours, one asking for a schema-valid object, one free request beside it in the batch.

# %%
schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                           "size": {"type": "integer"}}, "required": ["name", "size"]}
greedy = SamplingParams(max_tokens=40, temperature=0, structured=StructuredOutput(json_schema=schema))
free = SamplingParams(max_tokens=12, temperature=0)
prompts = ["config = ", "def main():"]
mine = LLM("tiny", components=Components(grammar_mask=apply_grammar_mask, source="this notebook"))
for who, engine in (("engine's mask", llm), ("your mask", mine)):
    outs = engine.generate(prompts, [greedy, free], use_tqdm=False)
    print(f"{who:>13}: {outs[0].text!r} | free: {outs[1].text!r}")

# %% [markdown]
# ## Exercise 8.7 · What a token costs (~5 min)
#
# A GPU is rented by the hour; users are billed by the token. The bridge is the throughput you
# measured: follow the units. A worked example on other numbers: a machine rented at $12 a **day**
# that makes 50 tokens a **minute** makes 72,000 tokens a day, so a token costs $12 / 72,000 and a
# thousand of them about 17 cents. Your function does the same with an hourly price, a rate per second
# and a million tokens. (Providers quote prices per **million** tokens; per thousand is an older
# convention and a thousand times smaller.) Throughput is the lever: the same GPU at 10x the tokens per
# second sells each token for a tenth.

# %% exercise="8.7"
def cost_per_million_tokens(price_per_hour: float, tokens_per_second: float) -> float:
    """Dollars per million tokens (a float) for a machine rented at price_per_hour dollars an hour that
    makes tokens_per_second tokens a second while rented.

    Raises ValueError for tokens_per_second <= 0 or not a number (say the value).
    """
    ### BEGIN SOLUTION
    if not tokens_per_second > 0:
        raise ValueError(f"tokens_per_second must be > 0, got {tokens_per_second!r}")
    return price_per_hour / (3600 * tokens_per_second) * 1e6
    ### END SOLUTION


# %%
print(f"a machine at $2.50/h making 2,500 tokens/s: ${cost_per_million_tokens(2.5, 2500):.3f} per million tokens")

# %% [markdown]
# <details><summary>Hint 1: a nudge</summary>
#
# How many tokens does the machine make in one hour? What does one of them cost, then?
# </details>
# <details><summary>Hint 2: the idea</summary>
#
# Cost per token = price per hour / tokens per hour; a million tokens cost a million times that. NaN fails
# every comparison: test so that it is refused.
# </details>
# <details><summary>Hint 3: last resort</summary>
#
# price_per_hour / (3600 · tokens_per_second) · 10⁶.
# </details>

# %%
check("8.7")

# %% [markdown]
# ## Measure it: SmolLM2 behind the server (~25 min)
#
# Now the main experiment, on the real chat model **SmolLM2-135M-Instruct** behind the real server:
# `serve_in_thread` runs the same application as `minillm serve` (in this process, bound to
# 127.0.0.1 on a free port), and the load generator (`minillm/serve/loadgen.py`) drives it with **your**
# `parse_sse` and `arrival_times` (its `parse_sse=` and `arrivals=` parameters). Your `request_metrics`,
# `percentile`, `goodput` and `cost_per_million_tokens` turn its records into the figures a service
# sells. Three questions, each answered first on paper:
#
# 1. what throughput does the server reach when every request arrives at once (its capacity)?
# 2. past which request rate does the p99 TTFT break the SLO?
# 3. how much more does a token cost served online, one request at a time, than in a batch job?
#
# **The theory: step costs.** A request of P prompt tokens and O output tokens costs one prefill
# (which yields its first token) and O − 1 decode steps. Served alone, it pays every decode step by
# itself. With B requests decoding together (lab 04), a step costs a little more than a step of one,
# but each request pays only a B-th of it. The next cell measures the three costs that decide it, on
# this machine: a prefill of one prompt, a decode step of one sequence, a decode step of B.

# %%
import time

from minillm.labkit import REAL_MODEL, compare, quick_run, real_model_installed

REAL = REAL_MODEL
QUICK = quick_run()  # True under the test suite: fewer requests and rates, the same method
N_REQUESTS, PROMPT_LEN, OUTPUT_LEN, MAX_SEQS = (6, 32, 8, 4) if QUICK else (24, 32, 16, 4)
HAVE_REAL = real_model_installed()
if HAVE_REAL:
    real_llm = LLM(REAL, max_num_seqs=MAX_SEQS)
    real_items = make_workload(N_REQUESTS, seed=0, prompt_len=PROMPT_LEN, output_len=OUTPUT_LEN,
                               tokenizer_model=REAL)
    prompt_ids = [real_llm.tokenizer.encode(item.prompt) for item in real_items[:MAX_SEQS]]

    def timed(prompts: list, max_tokens: int, reps: int = 1 if QUICK else 3) -> float:
        """The fastest of `reps` runs of these prompts to max_tokens tokens each, in seconds."""
        best = math.inf
        for _ in range(reps):
            start = time.perf_counter()
            real_llm.generate(prompts, SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True),
                              use_tqdm=False)
            best = min(best, time.perf_counter() - start)
        return best

    timed(prompt_ids[:1], 2, reps=1)  # warm-up: the first forward pays for allocations
    K = 8  # decode steps timed
    prefill_s = timed(prompt_ids[:1], 1)
    step_1 = (timed(prompt_ids[:1], 1 + K) - prefill_s) / K
    step_b = (timed(prompt_ids, 1 + K) - timed(prompt_ids, 1)) / K
    print(f"on this machine, {REAL} with one thread: a prefill of {len(prompt_ids[0])} tokens "
          f"{prefill_s * 1e3:.0f} ms; "
          f"a decode step of 1 sequence {step_1 * 1e3:.1f} ms, of {MAX_SEQS} sequences {step_b * 1e3:.1f} ms")
    print(f"the workload: {N_REQUESTS} requests of about {PROMPT_LEN} prompt tokens and {OUTPUT_LEN} output tokens; "
          f"the server batches up to {MAX_SEQS} sequences")

# %% [markdown]
# **Predict.** From the three costs above, work out the output tokens per second the server makes
# when all the requests arrive at once and it keeps `MAX_SEQS` of them decoding (ignore HTTP, and
# count the prefills as the engine's time too). Write it down before you run the sweep.
#
# <details><summary>Hint: the shape of the estimate</summary>
#
# At capacity, each request costs the engine one prefill plus its share of O − 1 batched decode steps; the
# number of requests per second is one over that; each brings O tokens.
# </details>

# %%
MY_PREDICTION = None  # output tokens/s with all requests at once: work it out from the step costs above

# %% [markdown]
# The sweep: the same requests at a few rates, from well below the capacity your theory gives to
# past it, then all at once. The SLO is set from this machine's own step costs (a TTFT of a few
# prefills, a TPOT of a little more than a batched step), so that it means the same on a fast and
# a slow CPU. (A shared CPU is noisy, and a few Poisson arrivals clump: expect the shape, not the
# decimals, and run it again with more requests if the rows disagree with each other.)

# %%
def load_test(base_url: str, rate: float, max_concurrency: int | None = None) -> dict:
    """The workload at `rate` requests/s through the server at base_url; -> the figures of one point."""
    load = run_load(base_url, real_items, model=REAL, rate=rate, seed=0, ignore_eos=True, progress=False,
                    max_concurrency=max_concurrency, parse_sse=parse_sse, arrivals=arrival_times)
    with ThreadPoolExecutor(1) as pool:  # Jupyter's event loop runs in this thread: the test gets its own
        result = pool.submit(asyncio.run, load).result()
    done = [r for r in result.records if r.success]
    metrics = [request_metrics(r) for r in done]
    ttfts = [m.ttft for m in metrics]
    return {"rate": rate, "throughput": sum(r.output_tokens for r in done) / result.duration,
            "ttft_p50": percentile(ttfts, 50), "ttft_p99": percentile(ttfts, 99),
            "tpot_p50": percentile([m.tpot for m in metrics if m.tpot is not None], 50),
            "goodput": goodput(result.records, result.duration, SLO), "failed": len(result.records) - len(done)}


if HAVE_REAL:
    per_request = prefill_s + (OUTPUT_LEN - 1) * step_b / MAX_SEQS  # engine seconds per request at capacity
    capacity = 1 / per_request  # requests/s
    bound = OUTPUT_LEN * capacity  # output tokens/s
    alone = OUTPUT_LEN / (prefill_s + (OUTPUT_LEN - 1) * step_1)  # tokens/s of one request at a time
    SLO = {"ttft": 4 * prefill_s, "tpot": 1.5 * step_b}
    print(f"the theory: capacity {capacity:.2f} req/s = {bound:.1f} output tokens/s; one at a time {alone:.1f} "
          f"tokens/s. SLO: TTFT <= {SLO['ttft'] * 1e3:.0f} ms, TPOT <= {SLO['tpot'] * 1e3:.0f} ms")
    fractions = (0.5, 1.5) if QUICK else (0.25, 0.5, 0.8, 1.0, 1.5)
    with serve_in_thread(real_llm) as real_server:  # stops when the block ends
        load_test(real_server.base_url, math.inf)  # a warm-up, not kept: the first batched steps of a shape pay extra
        online = load_test(real_server.base_url, math.inf, max_concurrency=1)  # one at a time
        curve = [load_test(real_server.base_url, f * capacity) for f in fractions]
        curve.append(load_test(real_server.base_url, math.inf))
    print(f"{'rate req/s':>10} {'tokens/s':>9} {'TTFT p50 ms':>12} {'TTFT p99 ms':>12} {'TPOT p50 ms':>12} "
          f"{'goodput req/s':>14} failed")
    for row in curve:
        print(f"{row['rate']:10.2f} {row['throughput']:9.1f} {row['ttft_p50'] * 1e3:12.0f} "
              f"{row['ttft_p99'] * 1e3:12.0f} {row['tpot_p50'] * 1e3:12.1f} {row['goodput']:14.2f} {row['failed']:6d}")
    broken = next((row["rate"] for row in curve if row["ttft_p99"] > SLO["ttft"]), None)
    print(f"the first rate whose p99 TTFT broke the SLO: "
          f"{'none of those tried' if broken is None else f'{broken:.2f} req/s'} (the theory's capacity: "
          f"{capacity:.2f} req/s)")
    compare(f"{REAL} behind the server, all requests at once", MY_PREDICTION, theory=bound,
            measured=curve[-1]["throughput"], unit="tokens/s", theory_name="step-cost bound",
            gap="below 1: HTTP, streaming, scheduling and the prefills that stall the batch cost more than the "
                "bare steps; above 1: the prefills of several prompts shared a step, or a shared CPU ran faster "
                "during the sweep than when the steps were timed (rerun both cells)")
    fig = go.Figure(go.Scatter(x=[r["throughput"] for r in curve], y=[r["ttft_p99"] * 1e3 for r in curve],
                               mode="markers+lines+text", textposition="top left",
                               text=[f"{r['rate']:.2f} req/s" for r in curve]))
    fig.add_hline(y=SLO["ttft"] * 1e3, line_dash="dot", annotation_text="TTFT SLO")
    fig.add_vline(x=bound, line_dash="dash", annotation_text="step-cost bound")
    fig.update_layout(title=f"Latency against throughput: {REAL} behind the server on this CPU",
                      xaxis_title="output tokens/s", yaxis_title="TTFT p99 (ms)", height=360)
    fig.show()

# %% [markdown]
# Read the table from the top: while the rate is below the capacity, throughput follows the rate and
# TTFT is about a prefill; near the capacity, requests start to wait for a free slot and the p99 TTFT
# climbs; past it, the queue grows for as long as requests keep coming, and goodput falls while
# throughput stays flat. Goodput is the figure to sell: the throughput of requests that were served
# on time.
#
# ## Online or batch: the price of waiting (~10 min)
#
# An online request must be answered now, so the engine runs with whatever is in the queue and
# keeps latency low. A batch job can wait: the engine packs every prompt in at once and runs at its
# best throughput. OpenAI's Batch API sells exactly that trade: requests submitted as a file,
# results within 24 hours, at half the price of the same requests made synchronously (OpenAI's
# documentation and pricing page). Above, the sweep also served the same requests one at a time
# (the most latency-friendly way: nothing waits behind anything); the last point of the curve is
# the batch job. Priced at `DEFAULT_PRICE_PER_HOUR` of `minillm/perf/cost.py`, the listed on-demand
# price of a 2-vCPU cloud VM (see its comment; pass your own machine's price instead).
#
# **Predict** first: how many times an online token's cost is a batch token's, from the step costs
# (the theory's two throughputs above).

# %%
MY_COST_RATIO = None  # an online token's cost over a batch token's: work it out from the step costs

# %%
PRICE_PER_HOUR = DEFAULT_PRICE_PER_HOUR
if HAVE_REAL:
    batch = curve[-1]
    for name, row in (("online, one at a time", online), ("batch, all at once", batch)):
        print(f"{name:>22}: {row['throughput']:6.1f} tokens/s, "
              f"${cost_per_million_tokens(PRICE_PER_HOUR, row['throughput']):7.2f} per million tokens, "
              f"TTFT p99 {row['ttft_p99'] * 1e3:.0f} ms")
    compare("an online token's cost over a batch token's", MY_COST_RATIO, theory=bound / alone,
            measured=cost_per_million_tokens(PRICE_PER_HOUR, online["throughput"])
            / cost_per_million_tokens(PRICE_PER_HOUR, batch["throughput"]), unit="x",
            theory_name="step-cost ratio",
            gap="the batch's advantage is how much a decode step of MAX_SEQS sequences costs less than MAX_SEQS "
                "steps of one; a GPU, whose steps barely grow with the batch, widens it")
    del real_llm

# %% [markdown]
# ## Exercise 8.8 · Stop a runaway agent (~10 min)
#
# An agent calls the model, runs the tool it asked for, and calls the model again with the result,
# until the task is done. Sometimes it never is: the model asks for the same tool call forever, or
# a task never converges and burns tokens. The harness (`minillm/agents/harness.py`) asks a
# **loop breaker** after every call whether to go on. Yours stops a session on the first rule that
# fires, checked in this order:
#
# 1. **repeat**: this output, normalised, occurs `max_repeats` times among the last `repeat_window`
#    outputs (this one included). `normalise(output)` (imported above) lower-cases, replaces every
#    number by `0` and collapses whitespace: a loop whose counter changes is still a loop;
# 2. **tokens**: the tokens of all calls so far, summed, reach `max_tokens`;
# 3. **calls**: `max_calls` calls have been made.
#
# Each rule fires *at* its boundary: on the `max_calls`-th call, not the one after. Return a
# reason that starts with the rule's name (`"repeat: ..."`, `"tokens: ..."`, `"calls: ..."`), or
# `None` to go on. The harness builds one breaker per session.

# %% exercise="8.8"
class LoopBreaker:
    """A circuit breaker for one agent session: check(output, tokens) after every model call."""

    def __init__(self, max_calls: int, max_tokens: int, repeat_window: int, max_repeats: int) -> None:
        """Caps, each an int >= 1 (not a bool, not a float), max_repeats <= repeat_window; raise ValueError
        otherwise (say which). Each breaker keeps its own counts: two breakers never share state.
        """
        ### BEGIN SOLUTION
        for name, value in (("max_calls", max_calls), ("max_tokens", max_tokens),
                            ("repeat_window", repeat_window), ("max_repeats", max_repeats)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if max_repeats > repeat_window:
            raise ValueError(f"max_repeats ({max_repeats}) must be <= repeat_window ({repeat_window})")
        self.max_calls, self.max_tokens, self.max_repeats = max_calls, max_tokens, max_repeats
        self.calls = self.tokens = 0
        self.recent = deque(maxlen=repeat_window)
        ### END SOLUTION

    def check(self, output: str, tokens: int) -> str | None:
        """Record one call (its output text, its tokens: an int >= 0). -> a str that starts with the name of
        the first rule that fires, in the order above ("repeat", "tokens", "calls"; the words after the name
        are yours), or None to go on.
        """
        ### BEGIN SOLUTION
        self.calls += 1
        self.tokens += tokens
        self.recent.append(normalise(output))
        repeats = Counter(self.recent)[self.recent[-1]]
        if repeats >= self.max_repeats:
            return f"repeat: the same output {repeats} times in the last {len(self.recent)} calls"
        if self.tokens >= self.max_tokens:
            return f"tokens: {self.tokens} tokens used, the cap is {self.max_tokens}"
        if self.calls >= self.max_calls:
            return f"calls: {self.calls} calls made, the cap is {self.max_calls}"
        return None
        ### END SOLUTION


# %%
breaker = LoopBreaker(max_calls=10, max_tokens=10_000, repeat_window=4, max_repeats=3)
for turn in range(6):
    output = f"call search(page={turn})" if turn > 1 else f"thinking about step {turn}"
    print(turn, repr(output), "->", breaker.check(output, tokens=120))

# %% [markdown]
# <details><summary>Hint 1: a nudge</summary>
#
# What must the breaker remember between calls? Two running totals, and only the last few outputs.
# </details>
# <details><summary>Hint 2: the idea</summary>
#
# A container of bounded length keeps the last `repeat_window` normalised outputs (the oldest falls out by
# itself); count how often the newest occurs among them. Check the rules in their order, each with `>=`.
# </details>
# <details><summary>Hint 3: last resort</summary>
#
# `collections.deque` with `maxlen`, and a count of the newest output in it; return the first rule's reason.
# </details>

# %%
check("8.8")

# %% [markdown]
# ## Agents and the KV cache: offload between calls (~5 min)
#
# Every call of an agent session starts with the whole previous call, so the prefix cache could
# skip all of it: if the blocks are still in the pool. While the agent waits for its tool, other
# sessions' calls fill the pool and evict them, and the next call computes its long prompt again.
# A second tier (`llm.engine.kv_offload.attach("host", capacity)`, `minillm/cache/offload.py`)
# keeps those blocks in host memory: the harness moves a waiting session's blocks out
# (`offload=True`) and the next call copies them back instead of recomputing them. Below, six
# seeded sessions with your breaker share a small pool, once without and once with the tier. Read
# the numbers before believing the story: the tier only pays when the pool is under enough pressure
# that follow-up prompts lose their prefix; when most prefixes survive anyway, the copies out and
# back are pure cost. Try more sessions, longer tool pauses or a smaller pool.

# %%
corpus = llm.tokenizer.encode(open(run_sessions.__code__.co_filename).read())
sessions = agent_workload(corpus, num_sessions=6, seed=0, system_tokens=48, task_tokens=12, tool_tokens=12,
                          tool_seconds=0.05, median_calls=3)
for offload in (False, True):
    engine = LLM("tiny", num_kv_blocks=24, block_size=8, max_num_seqs=4)
    if offload:
        engine.engine.kv_offload.attach("host", capacity=256)
    run = run_sessions(engine, sessions, max_tokens=4, offload=offload,
                       breaker=lambda: LoopBreaker(max_calls=6, max_tokens=2_000, repeat_window=3, max_repeats=3))
    later = run.followups()
    stops = Counter(reason.split(":")[0] for reason in run.stop_reasons.values())
    print(f"offload {'on ' if offload else 'off'}: {len(run.calls)} calls, follow-up prompts "
          f"{sum(c.cached_tokens for c in later) / max(1, sum(c.prompt_tokens for c in later)):.0%} cached, "
          f"mean follow-up TTFT {sum(c.ttft for c in later) / max(1, len(later)) * 1e3:.0f} ms, "
          f"{run.blocks_offloaded} blocks offloaded; sessions ended by {dict(stops)}")

# %% [markdown]
# ## Your parts inside the real server, load generator, engine and harness (~5 min)
#
# `check("8.E")` (also part of `make grade LAB=08`) plugs your parts in where they belong and runs
# them for real, through `minillm.labkit.plug`:
#
# * your grammar mask inside the engine: greedy structured outputs equal the reference engine's,
#   and validate against their schemas (`jsonschema`);
# * your `parse_sse` and `arrival_times` driving the load generator against a live server: every
#   request succeeds with the reference's token counts, sent in your arrivals' order, and your
#   `request_metrics` and `goodput` give the reference's figures on those records;
# * your `admit` inside the server: a flooded queue answers 429 with your Retry-After;
# * your `LoopBreaker` inside the agent harness: it stops sessions where the reference would.

# %%
check("8.E")

# %%
server.stop()

# %% [markdown]
# ## Measure it: a real chat model behind the server (~5 min)
#
# Everything above was served by `tiny`, a model of code that continues text and cannot answer a
# question. **SmolLM2-135M-Instruct** is a chat model: 135M parameters, trained to answer the
# messages of a conversation. The same server serves it, and two things become real:
#
# * `/v1/chat/completions` renders the messages with the model's own **chat template** (markers
#   such as `<|im_start|>user` around each turn, then the start of the assistant's turn), so the
#   prompt the engine sees holds more tokens than the words you wrote: `usage.prompt_tokens`
#   counts them. The answer ends at the model's end-of-turn token.
# * `response_format` with a `json_schema` turns on your grammar mask (8.6's job) for this request:
#   the answer is JSON of that shape (if `max_tokens` leaves room to close it), whatever the model
#   would have preferred to write. The mask fixes the form, not the facts: read the answers.
#
# Below, the server runs the real model, with your mask, on a free port of 127.0.0.1. Three
# questions stream back through your `parse_sse`, each one timed chunk by chunk into a
# `RequestRecord` for your `request_metrics`, and each answer is checked against the schema with
# `jsonschema`. Then one
# question without `response_format`, to see what the model writes when nothing constrains it.
# If the model is not installed, the cell tells you
# how to install it and skips.

# %%
import jsonschema

CAPITAL = {"type": "object", "additionalProperties": False, "required": ["city", "country"],
           "properties": {"city": {"type": "string", "maxLength": 24}, "country": {"type": "string", "maxLength": 24}}}


def ask(base_url: str, question: str, response_format: dict | None) -> tuple[str, RequestRecord]:
    """Stream one greedy chat request; -> the answer's text and what the client saw of it."""
    body = {"model": REAL, "max_tokens": 48, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "system", "content": "You answer in JSON."}, {"role": "user", "content": question}]}
    if response_format:
        body["response_format"] = response_format
    record, text = RequestRecord(request_id=question, start=time.perf_counter()), ""
    with httpx.stream("POST", base_url + "/v1/chat/completions", json=body, timeout=120) as response:
        response.raise_for_status()
        for payload in parse_sse(response.iter_lines()):
            if payload == "[DONE]":
                break
            if payload["choices"] and payload["choices"][0]["delta"].get("content"):
                record.chunk_times.append(time.perf_counter())
                text += payload["choices"][0]["delta"]["content"]
            if payload.get("usage"):
                record.prompt_tokens = payload["usage"]["prompt_tokens"]
                record.output_tokens = payload["usage"]["completion_tokens"]
    record.end, record.success = time.perf_counter(), True
    return text, record


if HAVE_REAL:
    json_format = {"type": "json_schema", "json_schema": {"name": "capital", "schema": CAPITAL}}
    lands = ["France", "Japan", "Italy"]
    questions = [f"What is the capital of {land}? Give the city and the country." for land in lands]
    yours = Components(grammar_mask=apply_grammar_mask, source="this notebook")
    with serve_in_thread(LLM(REAL, max_num_seqs=2, num_kv_blocks=64, components=yours)) as real_server:  # stops after
        answers = [ask(real_server.base_url, q, json_format) for q in questions]
        free_text, _ = ask(real_server.base_url, questions[0], None)
    print(f"{'the capital of':>14} {'prompt':>6} {'output':>6} {'TTFT':>7} {'TPOT':>7} {'E2E':>6}  valid  answer")
    for land, (text, record) in zip(lands, answers):
        m = request_metrics(record)
        tpot = f"{m.tpot * 1e3:4.0f} ms" if m.tpot is not None else "      –"  # None: a single output token
        try:
            jsonschema.validate(json.loads(text), CAPITAL)
            valid = "yes"
        except (json.JSONDecodeError, jsonschema.ValidationError) as e:
            valid = f"no ({type(e).__name__})"
        print(f"{land:>14} {record.prompt_tokens:6d} {record.output_tokens:6d} {m.ttft * 1e3:5.0f} ms "
              f"{tpot} {m.e2e:5.2f} s  {valid:5}  {text}")
    try:
        json.loads(free_text)
        parsed = "it parses as JSON"
    except json.JSONDecodeError:
        parsed = "it is not JSON"
    print(f"\nwithout response_format, asked the first question: {free_text!r} ({parsed})")

    fig = go.Figure([go.Scatter(x=[0.0] + [(t - record.start) * 1e3 for t in record.chunk_times],
                                y=list(range(len(record.chunk_times) + 1)), mode="lines+markers", line_shape="hv",
                                name=f"the capital of {land}") for land, (_, record) in zip(lands, answers)])
    fig.update_layout(title=f"{REAL} behind the server: chunks as the client received them (the first one: TTFT)",
                      xaxis_title="ms since the request was sent", yaxis_title="chunks received", height=360)
    fig.show()

# %% [markdown]
# Read the TTFT column from the top. Only the first request pays for compiling the schema into a
# grammar (the engine keeps compiled grammars, and the two others ask for the same schema) and for
# the engine's first forward; after that, TTFT is the prefill of the prompt the template built
# (which yields the first token) and the trip through HTTP. TPOT is a decode step of a 540 MB
# model on this CPU, the mask included. A GPU would shrink both.
#
# ## How production engines do it (~3 min)
#
# * **vLLM** serves the OpenAI API (`vllm serve`) with completions and chat, SSE streaming with
#   `stream_options.include_usage`, structured output through `guided_json` / `response_format`
#   (xgrammar by default, Outlines and others selectable), and Prometheus metrics for TTFT, TPOT,
#   queue time and KV-cache use. Its serving benchmark (`vllm bench serve`) sends open-loop
#   Poisson or gamma arrivals (`--request-rate`, `--burstiness`) and reports TTFT, TPOT, ITL and E2E
#   with mean, median and percentiles, and goodput under `--goodput` SLOs: this lab's definitions.
# * **SGLang** serves the same API; its grammar backends (xgrammar, Outlines, llguidance) fill the
#   bitmask on the CPU while the GPU runs the forward, so the mask costs almost nothing; its
#   RadixAttention keeps agents' shared prefixes cached between calls.
# * **xgrammar** (Dong et al. 2024) precomputes, for each grammar state, which tokens are allowed
#   regardless of the stack (most of them), so filling a bitmask is fast; `apply_token_bitmask_inplace`
#   is its mask kernel, the one your 8.6 is checked against.
# * **Admission and rate limits**: hosted APIs return 429 with rate-limit headers when a client
#   exceeds its quota; inside a cluster, routers (the Kubernetes Gateway API inference extension,
#   vLLM's production stack) route by queue length and KV-cache use rather than refuse.
# * **Batch APIs**: OpenAI's and Anthropic's batch APIs take a file of requests and answer within
#   24 hours at a 50% discount: the provider fills idle capacity at full batch throughput.
