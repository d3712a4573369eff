"""Routing policies measured on a real fleet: prefix hit rate, TTFT and throughput per policy.

The workload is multi-tenant and multi-turn, where routing matters: each tenant has a shared
system prompt, each session belongs to a tenant and makes `turns` calls in turn, call k sending
the system prompt and every earlier turn's new text plus its own (a prompt that grows, as an agent's
does). Sessions run concurrently; a session's calls one after another. Every policy gets a fresh
fleet (empty caches) and the same seeded workload through `loadgen.send`, and its hit rate is what
the replicas themselves counted (their `minillm_prefix_cache_hit_rate` gauge, weighted by each
replica's prompt tokens), beside the router's own estimate.

    measure_routing(replicas=2, quick=True)
    -> {"replicas": 2, "workload": {...}, "policies": {"round_robin": {"prefix_hit_rate": ..., ...}, ...}}

On a small CPU machine the replicas share its cores, so TTFT and throughput say more about
contention than about the policies; the hit rates are the robust figure.
"""
import asyncio
import time

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from minillm.models.registry import resolve_model_path
from minillm.perf.serving import RequestRecord, summarize
from minillm.router.fleet import Fleet
from minillm.router.policies import POLICIES
from minillm.serve.load_prompts import WorkItem, synthetic_ids
from minillm.serve.loadgen import request_body, send
from minillm.serve.sse import parse_sse
from minillm.tokenizer import Tokenizer


def tenant_sessions(tenants: int, sessions: int, turns: int, system_tokens: int, turn_tokens: int,
                    output_tokens: int, seed: int = 0, model: str = "tiny") -> list[list[WorkItem]]:
    """sessions lists of `turns` WorkItems; session s belongs to tenant s % tenants, and its call k's
    prompt is: tenant system prompt + turn 0 text + ... + turn k text (about system + (k+1) * turn tokens)."""
    rng = np.random.default_rng(seed)
    tokenizer = Tokenizer(resolve_model_path(model))
    systems = [tokenizer.decode(synthetic_ids(tokenizer, system_tokens, rng)) for _ in range(tenants)]
    out = []
    for s in range(sessions):
        prompt, calls = systems[s % tenants], []
        for _ in range(turns):
            prompt += "\n# next step\n" + tokenizer.decode(synthetic_ids(tokenizer, turn_tokens, rng))
            calls.append(WorkItem(prompt, output_tokens))
        out.append(calls)
    return out


async def run_sessions(base_url: str, sessions: list[list[WorkItem]], stagger: float, model: str = "tiny",
                       timeout: float = 120.0) -> tuple[list[RequestRecord], float]:
    """Session i starts at i * stagger seconds and sends its calls one after another (streamed,
    greedy, ignore_eos so each asks for its full output). -> the records and the duration."""
    url = base_url.rstrip("/") + "/v1/completions"

    async def session(i: int, calls: list[WorkItem], client: httpx.AsyncClient) -> list[RequestRecord]:
        await asyncio.sleep(i * stagger)
        return [await send(client, url, request_body(item, model, ignore_eos=True), f"s{i}-c{k}", parse_sse)
                for k, item in enumerate(calls)]

    async with httpx.AsyncClient(timeout=timeout) as client:
        t0 = time.perf_counter()
        per_session = await asyncio.gather(*(session(i, calls, client) for i, calls in enumerate(sessions)))
    records = [r for rs in per_session for r in rs]
    return records, max((r.end or t0) for r in records) - t0


def fleet_hit_rate(urls: list[str]) -> float:
    """The replicas' own prefix hit rates, weighted by the prompt tokens each served:
    sum_i rate_i * prompt_i / sum_i prompt_i."""
    rates, tokens = [], []
    for url in urls:
        samples = {s.name: s.value for f in text_string_to_metric_families(httpx.get(url + "/metrics").text)
                   for s in f.samples}
        rates.append(samples["minillm_prefix_cache_hit_rate"])
        tokens.append(samples["minillm_prompt_tokens_total"])
    return sum(r * t for r, t in zip(rates, tokens)) / sum(tokens) if sum(tokens) else 0.0


def measure_routing(replicas: int = 2, quick: bool = True, model: str | None = None,
                    policies: tuple[str, ...] = tuple(POLICIES)) -> dict:
    """Each policy on a fresh fleet of `replicas` replicas, the same workload; figures per policy:
    prefix_hit_rate (the replicas'), router_hit_estimate, ttft_p50_s, ttft_p99_s, output_tok_s,
    requests_s, completed, failed."""
    shape = dict(tenants=3, sessions=6, turns=4, system_tokens=96, turn_tokens=32, output_tokens=8) if quick else \
        dict(tenants=4, sessions=12, turns=6, system_tokens=128, turn_tokens=40, output_tokens=16)
    sessions = tenant_sessions(**shape, model=model or "tiny")
    out = {"replicas": replicas, "workload": shape, "policies": {}}
    for policy in policies:
        with Fleet.start(replicas, model, policy) as fleet:
            for url in fleet.urls:  # first calls pay one-off costs; 2 prompt tokens barely move the hit rates
                httpx.post(url + "/v1/completions", json={"model": model or "tiny", "prompt": "x=", "max_tokens": 2},
                           timeout=60)
            records, duration = asyncio.run(run_sessions(fleet.base_url, sessions, 0.25, model or "tiny"))
            s = summarize(records, duration)
            routed = fleet.state.replicas
            out["policies"][policy] = {
                "prefix_hit_rate": fleet_hit_rate(fleet.urls),
                "router_hit_estimate": sum(r.hit_tokens for r in routed) / max(sum(r.prompt_tokens for r in routed), 1),
                "ttft_p50_s": s["ttft_median"], "ttft_p99_s": s["ttft_p99"], "output_tok_s": s["output_throughput"],
                "requests_s": s["request_throughput"], "completed": s["completed"], "failed": s["failed"],
                "routed": [r.routed for r in routed]}
    return out
