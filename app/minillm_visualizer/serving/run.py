"""A load test for the page: the OpenAI-compatible server in this process, the load generator against it at
one arrival rate or a small sweep of rates, and the server's own `/metrics` scraped while it runs.

The server starts once per model and is shared by every session (st.cache_resource), around the weights
the other pages load (shared.engines); clearing the cache stops it. Each point of a run:

    items  = make_workload(n, seed, prompt_len, max_tokens)        the same prompts at every rate
    result = run_load(base_url, items, rate, burstiness)            one RequestRecord per request
    summary = summarize(result.records, result.duration, slo)       TTFT / TPOT / ITL / E2E, goodput
    server  = scrape(after) - scrape(before)                        what /metrics counted meanwhile
"""
import asyncio
import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import streamlit as st
from prometheus_client.parser import text_string_to_metric_families

from minillm import EngineConfig
from minillm.async_llm import AsyncLLM
from minillm.labkit.plug import lab_components, lab_parts
from minillm.perf.serving import RequestRecord, summarize
from minillm.serve import ServerHandle, serve_in_thread
from minillm.serve.arrivals import arrival_times
from minillm.serve.load_prompts import make_workload
from minillm.serve.loadgen import run_load
from minillm.serve.sse import parse_sse
from minillm_visualizer.shared.engines import build_engine

SCRAPE_EVERY_S = 0.5
SWEEP_FRACTIONS = (0.25, 0.5, 1.0)  # of the chosen rate; a last point sends everything at once (saturation)
# What the live panel reads from /metrics: a counter or histogram is shown as its change over the run,
# a gauge as it is now.
COUNTERS = ("minillm_requests_total", "minillm_generation_tokens_total", "minillm_prompt_tokens_total",
            "minillm_time_to_first_token_seconds_sum", "minillm_time_to_first_token_seconds_count",
            "minillm_inter_token_latency_seconds_sum", "minillm_inter_token_latency_seconds_count",
            "minillm_e2e_request_latency_seconds_count")
GAUGES = ("minillm_num_requests_running", "minillm_num_requests_waiting", "minillm_kv_cache_usage_ratio")


MAX_WAITING = 256  # the admission limit of the page's servers: requests queued beyond it get 429 + Retry-After
MINE = ("parse_sse", "arrival_times", "admit")  # the learner's lab 08 parts around the server (8.1, 8.4, 8.5)


@st.cache_resource(show_spinner="Starting the OpenAI-compatible server on a loopback port (once per server)...",
                   on_release=lambda handle: handle.stop())
def server(model: str, notebooks: str | None = None, edited: float = 0.0) -> ServerHandle:
    """The server on 127.0.0.1 (a free port), its engine around the shared weights: paged KV cache,
    continuous batching, the engine's default knobs. With `notebooks` (a folder or a lab 08 notebook), a
    server of its own whose engine masks structured output with the learner's grammar mask (8.6) and whose
    admission is the learner's `admit` (8.5); `edited` (the notebook's mtime) starts a new one after an edit."""
    if notebooks is None:
        return serve_in_thread(AsyncLLM.from_engine(build_engine(EngineConfig(model=model))), model_name=model,
                               max_waiting=MAX_WAITING)
    engine = build_engine(EngineConfig(model=model, components=lab_components(notebooks, ["08"])))
    return serve_in_thread(AsyncLLM.from_engine(engine), model_name=model, max_waiting=MAX_WAITING,
                           admission=lab_parts(notebooks, "08")["admit"])


def learner_client(notebooks: str | None) -> dict:
    """The load generator's SSE parser and arrival times: the learner's (8.1, 8.4) or the engine's. The
    learner's parts are tried once on a small input first, so an unfinished exercise stops the run with a
    LabPartError that names it, instead of failing every request."""
    if notebooks is None:
        return {"parse_sse": parse_sse, "arrivals": arrival_times}
    parts = lab_parts(notebooks, "08")
    list(parts["parse_sse"](["data: {}", ""]))
    parts["arrival_times"](2, 1.0, 0)
    parts["admit"](0, 1, 1.0)
    return {"parse_sse": parts["parse_sse"], "arrivals": parts["arrival_times"]}


@dataclass(frozen=True)
class Load:
    """What one point sends: `requests` prompts of about `prompt_tokens` tokens, each asking for exactly
    `max_tokens` (ignore_eos), arriving at `rate` requests/s (inf: all at once) with gamma gaps of shape
    `burstiness` (1: Poisson, < 1: clumps)."""
    requests: int
    prompt_tokens: int
    max_tokens: int
    burstiness: float
    seed: int = 0


@dataclass
class Point:
    rate: float                   # offered, requests/s; inf: all at once
    records: list[RequestRecord]  # one per request, in the workload's order
    duration: float               # seconds, first send to last response
    summary: dict                 # perf.serving.summarize's figures, with the SLOs
    server_figures: dict          # /metrics over the point: counters' changes, gauges at the end (change())
    server_text: str              # the last scrape, as the server wrote it


def sweep_rates(rate: float, sweep: bool) -> list[float]:
    """The offered rates of a run: the chosen one (0: all at once), or the sweep's fractions of it and then
    all at once. Raises ValueError for a sweep without a rate to take fractions of."""
    if not sweep:
        return [rate or math.inf]
    if rate <= 0:
        raise ValueError(f"a sweep needs an arrival rate > 0 requests/s to take {', '.join(map(str, SWEEP_FRACTIONS))} "
                         f"of (it ends with all at once anyway), got {rate}")
    return [rate * f for f in SWEEP_FRACTIONS] + [math.inf]


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> {sample name: value}, summed over label values (e.g. every endpoint and status of
    minillm_requests_total), except that requests count only /v1/completions, the load test's endpoint."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "minillm_requests_total" and sample.labels.get("endpoint") != "/v1/completions":
                continue
            out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


def change(before: dict[str, float], now: dict[str, float]) -> dict[str, float]:
    """The live panel's figures: counters since `before`, gauges now."""
    return {**{n: now.get(n, 0.0) - before.get(n, 0.0) for n in COUNTERS}, **{n: now.get(n, 0.0) for n in GAUGES}}


async def _scrape(client: httpx.AsyncClient, base_url: str) -> tuple[dict[str, float], str]:
    response = await client.get(base_url + "/metrics")
    response.raise_for_status()
    return parse_metrics(response.text), response.text


async def _point(handle: ServerHandle, model: str, load: Load, rate: float, slo: dict[str, float],
                 on_scrape: Callable[[dict[str, float], str], None], client_parts: dict) -> Point:
    items = make_workload(load.requests, seed=load.seed, prompt_len=load.prompt_tokens, output_len=load.max_tokens,
                          source="synthetic", tokenizer_model=model)
    async with httpx.AsyncClient(timeout=10.0) as client:
        before, _ = await _scrape(client, handle.base_url)
        task = asyncio.create_task(run_load(handle.base_url, items, model=model, rate=rate,
                                            burstiness=load.burstiness, seed=load.seed, ignore_eos=True,
                                            progress=False, **client_parts))
        while True:
            # the last scrape comes after every response has ended, so the counters are complete
            done, _ = await asyncio.wait({task}, timeout=SCRAPE_EVERY_S)
            now, text = await _scrape(client, handle.base_url)
            on_scrape(change(before, now), text)
            if done:
                break
    result = task.result()
    return Point(rate, result.records, result.duration, summarize(result.records, result.duration, slo),
                 change(before, now), text)


def run(model: str, load: Load, rates: list[float], slo: dict[str, float],
        on_scrape: Callable[[dict[str, float], str], None], on_point: Callable[[int, Point], None],
        notebooks: str | None = None) -> list[Point]:
    """Every rate in turn against the model's server, with the same prompts; on_scrape gets the live
    /metrics figures (and the raw text) every SCRAPE_EVERY_S, on_point each finished point. notebooks: run
    the learner's lab 08 parts (a LabPartError names the exercise when one is missing or fails)."""
    if load.requests < 1:
        raise ValueError(f"requests must be >= 1, got {load.requests}")
    edited = max((p.stat().st_mtime for p in _lab08(notebooks)), default=0.0)
    client_parts = learner_client(notebooks)
    handle = server(model, notebooks, edited)
    points = []
    for i, rate in enumerate(rates):
        points.append(asyncio.run(_point(handle, model, load, rate, slo, on_scrape, client_parts)))
        on_point(i, points[-1])
    return points


def _lab08(notebooks: str | None) -> list:
    if notebooks is None:
        return []
    path = Path(notebooks)
    return [path] if path.is_file() else sorted(path.glob("lab08_*.ipynb"))


def with_slo(points: list[Point], slo: dict[str, float]) -> list[Point]:
    """The same points summarized against other SLOs (goodput and attainment change; nothing is rerun)."""
    return [p if p.summary.get("slo") == slo else
            dataclasses.replace(p, summary=summarize(p.records, p.duration, slo)) for p in points]
