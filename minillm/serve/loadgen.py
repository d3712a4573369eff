"""A load generator for any OpenAI-compatible server (this one, vLLM, SGLang): send a seeded
workload, stream every response, and record what the client saw of each request.

    items = make_workload(64, seed=0, prompt_len=64, output_len=32)
    result = asyncio.run(run_load("http://127.0.0.1:8000", items, rate=4.0))
    summarize(result.records, result.duration, slo={"ttft": 0.5, "tpot": 0.05})

Two ways to load a server, as in vLLM's benchmark: open loop (requests arrive at the times of
`arrivals(n, rate, seed, burstiness)`, however slow the server gets: that is how users behave) or
closed loop (`max_concurrency` requests in flight, the next sent when one finishes; with both,
arrivals wait for a free slot). `parse_sse` and `arrivals` are parameters so that a lab can run
this generator on the learner's own implementations.
"""
import asyncio
import math
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import httpx
from tqdm.auto import tqdm

from minillm.perf.serving import RequestRecord
from minillm.serve.arrivals import arrival_times
from minillm.serve.load_prompts import WorkItem
from minillm.serve.sse import DONE
from minillm.serve.sse import parse_sse as default_parse_sse

ParseSSE = Callable[[Iterable[str]], Iterator[dict | str]]
Arrivals = Callable[[int, float, int, float], list[float]]


@dataclass
class LoadResult:
    records: list[RequestRecord]  # one per work item, in the workload's order
    duration: float               # seconds from the first send to the last response's end


def request_body(item: WorkItem, model: str, ignore_eos: bool) -> dict:
    """A streaming, greedy /v1/completions body. ignore_eos is a vLLM extension (also served here):
    sent only when asked, since a strict OpenAI server refuses unknown fields."""
    body = {"model": model, "prompt": item.prompt, "max_tokens": item.max_tokens, "temperature": 0.0,
            "stream": True, "stream_options": {"include_usage": True}}
    if ignore_eos:
        body["ignore_eos"] = True
    return body


def carries_tokens(chunk: dict) -> bool:
    """A chunk counts as a token arrival when it has a choice with text, or a choice that is not the
    bare end marker (a token may decode to no text yet: half of a multi-byte character)."""
    choices = chunk.get("choices") or []
    return any(c.get("text") or c.get("finish_reason") is None for c in choices)


async def events(response: httpx.Response, parse_sse: ParseSSE):
    """The response's SSE payloads as each event completes: lines gather until the blank line that
    ends an event, then parse_sse decodes that event (parse_sse is synchronous, the socket is not)."""
    lines: list[str] = []
    async for line in response.aiter_lines():
        lines.append(line)
        if line == "":
            for payload in parse_sse(lines):
                yield payload
            lines = []
    for payload in parse_sse(lines):
        yield payload


async def send(client: httpx.AsyncClient, url: str, body: dict, request_id: str,
               parse_sse: ParseSSE) -> RequestRecord:
    """Stream one request; every failure (HTTP status, broken stream, no [DONE]) ends in its record."""
    record = RequestRecord(request_id, start=time.perf_counter())
    counted = 0
    try:
        async with client.stream("POST", url, json=body) as response:
            if response.status_code != 200:
                record.error = f"HTTP {response.status_code}: {(await response.aread()).decode(errors='replace')}"
                return record
            async for payload in events(response, parse_sse):
                now = time.perf_counter()
                if payload == DONE:
                    record.success = True
                    break
                if not isinstance(payload, dict):
                    raise ValueError(f"a stream event is not JSON: {payload!r}")
                if "error" in payload:
                    raise ValueError(f"the server reported an error mid-stream: {payload['error']}")
                if carries_tokens(payload):
                    record.chunk_times.append(now)
                    counted += 1
                usage = payload.get("usage")
                if usage:
                    record.prompt_tokens = usage.get("prompt_tokens", 0)
                    record.output_tokens = usage.get("completion_tokens", 0)
        record.end = time.perf_counter()
        if not record.success:
            record.error = "the stream ended without its [DONE] marker"
        elif not record.output_tokens:
            record.output_tokens = counted  # a server without usage in streams: one token per chunk
        if record.success and not record.chunk_times:
            record.success, record.error = False, "the stream carried no tokens"
    except (httpx.HTTPError, ValueError) as e:
        record.success, record.error = False, f"{type(e).__name__}: {e}"
    return record


async def run_load(base_url: str, items: list[WorkItem], *, model: str = "tiny", rate: float = math.inf,
                   burstiness: float = 1.0, max_concurrency: int | None = None, seed: int = 0,
                   ignore_eos: bool = False, endpoint: str = "/v1/completions",
                   parse_sse: ParseSSE = default_parse_sse, arrivals: Arrivals = arrival_times,
                   timeout: float = 600.0, progress: bool = True, desc: str = "load") -> LoadResult:
    """Send every item to base_url + endpoint at its arrival time (rate in requests/s; inf: all at
    once), at most max_concurrency in flight (None: no limit). desc: the progress bar's label.
    -> the records and the duration."""
    if max_concurrency is not None and max_concurrency < 1:
        raise ValueError(f"max_concurrency must be >= 1 or None (no limit), got {max_concurrency}")
    times = arrivals(len(items), rate, seed, burstiness)
    slots = asyncio.Semaphore(max_concurrency or len(items) or 1)
    url = base_url.rstrip("/") + endpoint
    limits = httpx.Limits(max_connections=max_concurrency or len(items) or 1, max_keepalive_connections=None)
    bar = tqdm(total=len(items), desc=desc, unit="req", leave=False, disable=not progress, file=sys.stderr)

    async def one(i: int, item: WorkItem, client: httpx.AsyncClient, t0: float) -> RequestRecord:
        await asyncio.sleep(max(0.0, t0 + times[i] - time.perf_counter()))
        async with slots:
            record = await send(client, url, request_body(item, model, ignore_eos), f"load-{i}", parse_sse)
        bar.update()
        return record

    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        t0 = time.perf_counter()
        records = await asyncio.gather(*(one(i, item, client, t0) for i, item in enumerate(items)))
    ends = [r.end for r in records if r.end is not None]
    bar.close()
    return LoadResult(list(records), (max(ends) if ends else time.perf_counter()) - t0)
