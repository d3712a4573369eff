"""The OpenAI-compatible server, checked through the official `openai` client and raw HTTP: outputs
equal offline generation (streamed or not, 64 clients at once), log-probabilities equal the
model's own logits, structured output validates with `jsonschema`, a client that disconnects frees
its KV blocks, /metrics parses with Prometheus' parser, and SIGTERM drains then exits 0."""
import asyncio
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import weakref
from pathlib import Path

import httpx
import jsonschema
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from minillm import LLM, SamplingParams
from minillm.serve import serve_in_thread
from minillm.testing import wait_until

PROMPTS = ["def fib(n):", "import os\n", "class Stack:", "for i in range(10):", "def parse(text):\n    ",
           "# sort a list\n", "x = [", "async def fetch(url):"]


def greedy(max_tokens: int, **extra) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True, **extra)


def test_completions_stream_and_not_equal_offline_generation(client, offline):
    expected = offline.generate(PROMPTS[:2], greedy(12))
    whole = client.completions.create(model="tiny", prompt=PROMPTS[:2], max_tokens=12, temperature=0,
                                      extra_body={"ignore_eos": True})
    assert [c.text for c in sorted(whole.choices, key=lambda c: c.index)] == [o.text for o in expected]
    assert {c.finish_reason for c in whole.choices} == {"length"}
    assert whole.usage.prompt_tokens == sum(len(o.prompt_token_ids) for o in expected)
    assert whole.usage.completion_tokens == 24 and whole.usage.total_tokens == whole.usage.prompt_tokens + 24

    events = list(client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=12, temperature=0,
                                            stream=True, stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True}))
    assert "".join(e.choices[0].text for e in events if e.choices) == expected[0].text
    assert events[-1].choices == [] and events[-1].usage.completion_tokens == 12  # the usage chunk comes last
    assert [e.choices[0].finish_reason for e in events if e.choices][-1] == "length"


def test_chat_renders_the_template_and_equals_offline_generation(client, offline, server):
    messages = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "def add(a, b):"}]
    prompt = server.app.state.server.template.render(messages)
    assert prompt == "system: You write Python.\n\nuser: def add(a, b):\n\nassistant:"
    expected = offline.generate(prompt, greedy(10))[0]
    reply = client.chat.completions.create(model="tiny", messages=messages, max_tokens=10, temperature=0,
                                           extra_body={"ignore_eos": True})
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content == expected.text
    assert reply.usage.prompt_tokens == len(expected.prompt_token_ids)
    stream = list(client.chat.completions.create(model="tiny", messages=messages, max_tokens=10, temperature=0,
                                                 stream=True, extra_body={"ignore_eos": True}))
    assert stream[0].choices[0].delta.role == "assistant"
    assert "".join(e.choices[0].delta.content or "" for e in stream) == expected.text
    assert stream[-1].choices[0].finish_reason == "length"


def test_logprobs_are_the_models_own_in_both_shapes(client, offline):
    out = client.completions.create(model="tiny", prompt=PROMPTS[2], max_tokens=6, temperature=0, logprobs=3)
    lp = out.choices[0].logprobs
    ids = offline.tokenizer.encode(PROMPTS[2])
    gen = offline.generate(PROMPTS[2], greedy(6))[0].token_ids
    logits = offline.logits(ids + gen).log_softmax(-1)  # [len, vocab]: the reference, one full forward
    for i, token in enumerate(gen):
        row = logits[len(ids) - 1 + i]
        assert lp.token_logprobs[i] == pytest.approx(float(row[token]), abs=1e-3)
        top3 = sorted(row.topk(3).values.tolist(), reverse=True)
        assert sorted(lp.top_logprobs[i].values(), reverse=True)[:3] == pytest.approx(top3, abs=1e-3)
    assert lp.text_offset[0] == 0 and lp.text_offset[1] == len(lp.tokens[0])

    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x = 1"}],
                                          max_tokens=4, temperature=0, logprobs=True, top_logprobs=2)
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens
    for entry in content:
        assert len(entry.top_logprobs) == 2 and entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob
        assert entry.logprob == pytest.approx(entry.top_logprobs[0].logprob)  # greedy takes the likeliest
        assert bytes(entry.bytes).decode() == entry.token


def test_n_samples_each_with_its_index_and_seed(client, offline):
    kwargs = dict(model="tiny", prompt=PROMPTS[3], max_tokens=8, temperature=1.0, n=3, seed=7)
    out = client.completions.create(**kwargs)
    expected = offline.generate(PROMPTS[3], SamplingParams(max_tokens=8, temperature=1.0, n=3, seed=7))[0]
    assert sorted(c.index for c in out.choices) == [0, 1, 2]
    assert [c.text for c in sorted(out.choices, key=lambda c: c.index)] == [c.text for c in expected.outputs]
    streamed = {}
    for event in client.completions.create(**kwargs, stream=True):
        for c in event.choices:
            streamed[c.index] = streamed.get(c.index, "") + c.text
    assert [streamed[i] for i in range(3)] == [c.text for c in expected.outputs]


@pytest.mark.timeout(120)
def test_64_concurrent_streams_lose_and_duplicate_nothing(server, offline):
    rng = random.Random(0)
    jobs = [(PROMPTS[i % len(PROMPTS)] + " " * (i // len(PROMPTS)), rng.randint(1, 16)) for i in range(64)]
    expected = offline.generate([p for p, _ in jobs], [greedy(m) for _, m in jobs])
    client = openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)

    async def one(prompt: str, max_tokens: int) -> tuple[str, str]:
        stream = await client.completions.create(model="tiny", prompt=prompt, max_tokens=max_tokens, temperature=0,
                                                 stream=True, extra_body={"ignore_eos": True})
        text, reasons = "", []
        async for event in stream:
            text += event.choices[0].text
            reasons.append(event.choices[0].finish_reason)
        assert reasons[-1] == "length" and reasons.count("length") == 1
        return text

    async def main():
        return await asyncio.gather(*(one(p, m) for p, m in jobs))

    assert asyncio.run(main()) == [o.text for o in expected]
    assert wait_until(lambda: server.llm.kv_stats().used_blocks == 0)


def test_disconnect_mid_stream_frees_its_blocks(server, client):
    body = {"model": "tiny", "prompt": PROMPTS[4], "max_tokens": 400, "temperature": 0, "ignore_eos": True,
            "stream": True}
    with httpx.Client(base_url=server.base_url, timeout=30) as http:
        with http.stream("POST", "/v1/completions", json=body) as response:
            assert response.status_code == 200
            events = []
            for line in response.iter_lines():
                if line.startswith("data: "):
                    events.append(line)
                if len(events) == 3:
                    break
            assert server.llm.kv_stats().used_blocks > 0  # the request holds blocks while it runs
    assert wait_until(lambda: server.llm.kv_stats().used_blocks == 0, timeout=3.0), "blocks not freed"
    assert server.llm.num_running == 0 and server.llm.num_waiting == 0
    assert client.completions.create(model="tiny", prompt="x", max_tokens=2).choices[0].finish_reason


def schema_for(seed: int) -> dict:
    """A random object schema: integer (bounded), boolean, enum and bounded-string properties, all required."""
    rng = random.Random(seed)
    kinds = [{"type": "integer", "minimum": 0, "maximum": 999}, {"type": "boolean"},
             {"type": "string", "enum": ["red", "green", "blue"]}, {"type": "string", "maxLength": 8}]
    props = {f"f{i}": rng.choice(kinds) for i in range(rng.randint(2, 4))}
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


@pytest.mark.timeout(120)
def test_structured_outputs_validate_inside_a_batch_of_free_requests(server):
    client = openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)
    schemas = [schema_for(seed) for seed in range(4)]
    regex = r"def [a-z_]{1,12}\([a-z]{0,6}\):"

    async def constrained(schema):
        fmt = {"type": "json_schema", "json_schema": {"name": "thing", "schema": schema}}
        out = await client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "JSON:"}],
                                                   max_tokens=100, temperature=0.8, seed=1, response_format=fmt)
        return out.choices[0].message.content

    async def main():
        free = [client.completions.create(model="tiny", prompt=p, max_tokens=30, temperature=0.8, seed=2)
                for p in PROMPTS[:4]]
        anything = client.completions.create(model="tiny", prompt="json.dumps(", max_tokens=100, temperature=0,
                                             extra_body={"response_format": {"type": "json_object"}})
        matched = client.completions.create(model="tiny", prompt="# helper\n", max_tokens=40, temperature=0.5,
                                            seed=3, extra_body={"guided_regex": regex})
        return await asyncio.gather(*(constrained(s) for s in schemas), *free, anything, matched)

    results = asyncio.run(main())
    for schema, text in zip(schemas, results):
        jsonschema.validate(json.loads(text), schema)
    assert isinstance(json.loads(results[-2].choices[0].text), dict)
    assert re.fullmatch(regex, results[-1].choices[0].text), results[-1].choices[0].text
    assert wait_until(lambda: server.llm.kv_stats().used_blocks == 0)


def families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def count(metrics: dict, endpoint: str, status: str) -> float:
    return sum(s.value for s in metrics["minillm_requests"].samples if s.name.endswith("_total")
               and s.labels == {"endpoint": endpoint, "status": status})


def test_metrics_count_the_requests_made(server, client):
    before = families(httpx.get(server.base_url + "/metrics").text)
    outs = [client.completions.create(model="tiny", prompt=p, max_tokens=5, temperature=0) for p in PROMPTS[:3]]
    httpx.post(server.base_url + "/v1/completions", json={"model": "tiny", "prompt": "x", "temperature": -1})
    after = families(httpx.get(server.base_url + "/metrics").text)
    assert count(after, "/v1/completions", "200") - count(before, "/v1/completions", "200") == 3
    assert count(after, "/v1/completions", "400") - count(before, "/v1/completions", "400") == 1

    def total(m, name, suffix):
        return next(s.value for s in m[name].samples if s.name == name + suffix)
    assert total(after, "minillm_time_to_first_token_seconds", "_count") - \
        total(before, "minillm_time_to_first_token_seconds", "_count") == 3
    generated = sum(o.usage.completion_tokens for o in outs)
    assert total(after, "minillm_generation_tokens", "_total") - \
        total(before, "minillm_generation_tokens", "_total") == generated
    assert total(after, "minillm_num_requests_running", "") == 0
    assert 0 <= total(after, "minillm_kv_cache_usage_ratio", "") <= 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.timeout(90)
def test_sigterm_lets_the_stream_finish_then_exits_zero():
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "minillm", "serve", "--port", str(port), "--grace-period", "20"],
                            cwd=Path(__file__).resolve().parents[2], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        base = f"http://127.0.0.1:{port}"
        assert wait_until(lambda: _healthy(base), timeout=60), proc.stderr.read1().decode() if proc.poll() else ""
        body = {"model": "tiny", "prompt": "def main():", "max_tokens": 40, "temperature": 0, "ignore_eos": True,
                "stream": True}
        with httpx.Client(base_url=base, timeout=60) as http, http.stream("POST", "/v1/completions", json=body) as r:
            lines = r.iter_lines()
            first = next(line for line in lines if line.startswith("data: "))
            proc.send_signal(signal.SIGTERM)
            rest = [line for line in lines if line.startswith("data: ")]
        assert rest[-1] == "data: [DONE]"
        assert json.loads(rest[-2][6:])["choices"][0]["finish_reason"] == "length"
        assert first and proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _healthy(base: str) -> bool:
    try:
        return httpx.get(base + "/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_a_stopped_server_frees_its_engine_and_kv_pool():
    """Nothing outlives a server that stopped: FastAPI caches endpoint callables for the process's life, so an
    endpoint that held the server (a bound method, a closure) kept every stopped server's pool alive."""
    import gc
    llm = LLM("tiny", num_kv_blocks=64)
    engine = weakref.ref(llm.engine)  # it owns the KV pool
    with serve_in_thread(llm) as server:
        assert httpx.get(server.base_url + "/v1/models").status_code == 200
        assert httpx.get(server.base_url + "/metrics").status_code == 200
    del llm, server
    gc.collect()
    assert engine() is None, "the stopped server's engine (and its KV pool) is still referenced"
