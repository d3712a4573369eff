"""One request's failure is its own: a request that makes a per-request part of the engine's step raise
(its logits processors, its stop-string check) fails alone, with an error event on its stream (or a 500)
and an error in /metrics, while the healthy streams beside it complete exactly as they would without it."""
import asyncio
import re

import httpx
import pytest
from serve_helpers import slowed

import minillm.engine.output_processor as output_processor
import minillm.engine.sampler as sampler
from minillm import AsyncLLM
from minillm.engine.runner import ModelRunner
from minillm.serve.sse import parse_sse

POISON = 0.123  # the presence_penalty that marks the poisoned request
HEALTHY = [{"model": "tiny", "prompt": p, "max_tokens": 24, "temperature": 0, "presence_penalty": 0.5,
            "stop": ["never appears"], "stream": True} for p in ("def f():", "import os\n", "class A:", "x = [")]
BAD = {**HEALTHY[0], "presence_penalty": POISON, "stop": ["POISON"]}


@pytest.fixture(scope="module")
def llm():
    return slowed(AsyncLLM("tiny"), 0.01)  # every stream is still open when the poisoned one arrives


def raising_logits_processors():
    real = sampler.process_logits

    def process(logits, histories):
        if any(h.params.presence_penalty == POISON for h in histories):
            raise RuntimeError("a logits processor broke on this request")
        return real(logits, histories)
    return "process_logits", sampler, process


def raising_stop_check():
    real = output_processor.cut_at_stop_string

    def cut(seq, *since):
        if "POISON" in seq.params.stop:
            raise RuntimeError("the stop check broke on this request")
        return real(seq, *since)
    return "cut_at_stop_string", output_processor, cut


async def stream_all(server, bodies: list[dict]) -> list[list]:
    """Each body's stream, as its events without the fields that differ between runs (id, created)."""
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        async def one(body):
            r = await http.post("/v1/completions", json=body)
            events = list(parse_sse(r.text.splitlines()))
            return [{k: v for k, v in e.items() if k not in ("id", "created")} if isinstance(e, dict) else e
                    for e in events]
        return await asyncio.gather(*(one(b) for b in bodies))


def stream_errors(server, status: str) -> float:
    text = httpx.get(server.base_url + "/metrics").text
    found = re.search(rf'minillm_stream_errors_total{{status="{status}"}} (\S+)', text)
    return float(found.group(1)) if found else 0.0


@pytest.mark.parametrize("poison", [raising_logits_processors, raising_stop_check])
def test_a_poisoned_request_fails_alone_and_the_healthy_streams_are_unchanged(server, monkeypatch, poison):
    name, module, fake = poison()
    monkeypatch.setattr(module, name, fake)
    alone = asyncio.run(stream_all(server, HEALTHY))
    errors_before = stream_errors(server, "500")
    *beside, bad = asyncio.run(stream_all(server, [*HEALTHY, BAD]))
    assert beside == alone  # every healthy stream, event for event
    assert all(s[-1] == "[DONE]" and s[-2]["choices"][0]["finish_reason"] == "length" for s in alone)
    assert bad[-1] == "[DONE]" and "error" in bad[-2], bad
    error = bad[-2]["error"]
    assert error["type"] == "internal_server_error" and "broke on this request" in error["message"]
    assert stream_errors(server, "500") == errors_before + 1
    whole = httpx.post(server.base_url + "/v1/completions", json={**BAD, "stream": False}, timeout=60)
    assert whole.status_code == 500 and "the engine failed on this request" in whole.json()["error"]["message"]
    assert server.llm.num_running == 0 and server.llm.kv_stats().used_blocks == 0


def test_a_step_that_fails_for_everyone_ends_each_stream_with_an_error_counted_in_metrics(server, monkeypatch):
    real, failed = ModelRunner.execute, []

    def execute_once_broken(runner, batch):
        if not failed and len(batch) > 1:  # the model's forward: a fault of the engine, not of one request
            failed.append(True)
            raise RuntimeError("the forward broke")
        return real(runner, batch)
    monkeypatch.setattr(ModelRunner, "execute", execute_once_broken)
    errors_before = stream_errors(server, "500")
    streams = asyncio.run(stream_all(server, HEALTHY))
    assert failed
    cut = [s for s in streams if "error" in s[-2]]
    assert cut and all(s[-1] == "[DONE]" and "the forward broke" in s[-2]["error"]["message"] for s in cut)
    assert stream_errors(server, "500") == errors_before + len(cut)
    assert server.llm.num_running == 0 and server.llm.kv_stats().used_blocks == 0
