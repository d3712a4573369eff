"""Bad input gets the right status and a message that names the problem, in OpenAI's error shape
(the official client raises its typed errors from it): 400 for malformed JSON, wrong types and
out-of-range values, a prompt too long for the context and an invalid schema; 404 for an unknown
model; 401 without the API key; 429 with Retry-After when the queue is full. Never a 500."""
import asyncio
import math
import threading

import httpx
import openai
import pytest
from serve_helpers import post, reached

from minillm import AsyncLLM
from minillm.cli import is_loopback, main
from minillm.serve import admit, serve_in_thread

OK = {"model": "tiny", "prompt": "def f():", "max_tokens": 2}
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
LONG = "x = 1\n" * 400  # about 1,600 tokens: over the 512-token context


@pytest.mark.parametrize("path, body, field, words", [
    ("/v1/completions", '{"model": "tiny", "prompt": ', None, "not valid JSON"),
    ("/v1/completions", "[1, 2]", None, "valid dictionary"),
    ("/v1/completions", {**OK, "temperature": "hot"}, "temperature", "valid number"),
    ("/v1/completions", {**OK, "max_tokens": "ten"}, "max_tokens", "valid integer"),
    ("/v1/completions", {**OK, "stream": "yes"}, "stream", "valid boolean"),
    ("/v1/completions", {**OK, "prompt": [1, "a"]}, "prompt", "accepted: str | list[str]"),
    ("/v1/completions", {**OK, "temperature": -0.5}, "temperature", "greater than or equal to 0"),
    ("/v1/completions", {**OK, "top_p": 0}, "top_p", "greater than 0"),
    ("/v1/completions", {**OK, "top_p": 1.5}, "top_p", "less than or equal to 1"),
    ("/v1/completions", {**OK, "n": 0}, "n", "greater than or equal to 1"),
    ("/v1/completions", {**OK, "max_tokens": -1}, "max_tokens", "greater than or equal to 0"),
    ("/v1/chat/completions", {**CHAT, "max_tokens": 0}, "max_tokens", "greater than or equal to 1"),
    ("/v1/completions", {**OK, "logprobs": 21}, "logprobs", "less than or equal to 20"),
    ("/v1/completions", {**OK, "presense_penalty": 0.5}, "presense_penalty", "Extra inputs are not permitted"),
    ("/v1/completions", {**OK, "presence_penalty": 2.5}, "presence_penalty", "less than or equal to 2"),
    ("/v1/completions", {**OK, "seed": 2**64}, "seed", "less than or equal to 9223372036854775807"),
    ("/v1/completions", {**OK, "seed": -(2**63) - 1}, "seed", "greater than or equal to"),
    ("/v1/completions", {**OK, "best_of": 3, "n": 2}, None, "best_of (3) must equal n (2)"),
    ("/v1/completions", {**OK, "suffix": "return x"}, None, "suffix"),
    ("/v1/completions", {**OK, "logit_bias": {"a": 1}}, "logit_bias", "token ids written as decimal strings"),
    ("/v1/completions", {**OK, "logit_bias": {"99999999": 1}}, None, "token ids are 0 to"),
    ("/v1/completions", {**OK, "temperature": None, "n": None, "top_p": None, "logprobs": None, "stream": None,
                         "stream_options": {"bogus": True}}, "stream_options.bogus", "Extra inputs"),
    ("/v1/chat/completions", {**CHAT, "tools": [{"type": "function", "function": {"name": "f"}}]}, None,
     "tool calling is not supported"),
    ("/v1/chat/completions", {**CHAT, "tool_choice": "required"}, None, "tool calling is not supported"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "look:"}, {"type": "image_url", "image_url": {"url": "data:,"}}]}]},
     "messages.0.content", "this model is text-only"),
    ("/v1/completions", {"model": "tiny"}, "prompt", "Field required"),
    ("/v1/completions", {**OK, "prompt": ""}, None, "prompt is empty"),
    ("/v1/completions", {**OK, "stop": [""]}, None, "stop strings must be non-empty"),
    ("/v1/completions", {**OK, "prompt": LONG}, None, "exceeds the context length of 512 tokens"),
    ("/v1/completions", {**OK, "max_tokens": 600}, None, "max_tokens (600)"),
    ("/v1/completions", {**OK, "response_format": {"type": "json_schema", "json_schema": {
        "name": "bad", "schema": {"type": "objekt"}}}}, None, "json schema cannot be compiled"),
    ("/v1/completions", {**OK, "response_format": {"type": "json_schema"}}, "response_format",
     "json_schema is required"),
    ("/v1/completions", {**OK, "guided_regex": "[a-", "response_format": {"type": "json_object"}}, None,
     "exactly one of"),
    ("/v1/chat/completions", {**CHAT, "messages": []}, "messages", "at least 1 item"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "robot", "content": "x"}]}, "messages.0.role",
     "'user'"),
    ("/v1/chat/completions", {**CHAT, "top_logprobs": 3}, None, "needs logprobs"),
    ("/v1/chat/completions", {**CHAT, "top_logprobs": 21, "logprobs": True}, "top_logprobs", "less than"),
    ("/v1/chat/completions", {**CHAT, "max_tokens": None, "messages": [{"role": "user", "content": LONG}]},
     None, "the messages take"),
])
def test_bad_input_is_a_400_naming_the_problem(server, path, body, field, words):
    r = post(server, path, body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert words in error["message"], error["message"]
    if field is not None:
        assert error["message"].startswith(field + ":") and error["param"] == field.split(".")[0]


def test_the_official_client_raises_its_typed_errors(server, llm):
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.NotFoundError, match="model 'gpt-4' does not exist"):
        client.completions.create(model="gpt-4", prompt="x", max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], temperature=-1)
    assert post(server, "/v1/nowhere", OK).status_code == 404
    assert client.completions.create(**OK).choices[0].text is not None  # and the server still serves
    assert llm.kv_stats().used_blocks == 0 and llm.num_waiting == 0  # refused requests left nothing queued


def test_api_key_is_required_on_every_endpoint_but_health():
    with serve_in_thread("tiny", api_key="s3cret") as server:  # an engine is driven by one server's loop only
        missing = post(server, "/v1/completions", "{not json")  # auth comes before anything reads the body
        assert missing.status_code == 401 and "missing API key" in missing.json()["error"]["message"]
        wrong = post(server, "/v1/completions", OK, Authorization="Bearer nope")
        assert wrong.status_code == 401 and "invalid API key" in wrong.json()["error"]["message"]
        assert httpx.get(server.base_url + "/metrics").status_code == 401
        assert httpx.get(server.base_url + "/health").status_code == 200
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=server.base_url + "/v1", api_key="nope", max_retries=0).models.list()
        good = openai.OpenAI(base_url=server.base_url + "/v1", api_key="s3cret", max_retries=0)
        assert [m.id for m in good.models.list().data] == ["tiny"]
        assert good.completions.create(**OK).usage.completion_tokens == 2


def test_admit_retry_after_is_the_excess_over_the_drain_rate():
    assert admit(0, 4, 0.0) is None and admit(3, 4, 1.0) is None
    assert admit(4, 4, 2.0) == 1.0            # one over, drained in half a second: at least 1 s
    assert admit(9, 4, 2.0) == math.ceil(6 / 2)
    assert admit(9, 4, 0.0) == 6.0             # nothing drained lately: one request per second


@pytest.mark.timeout(60)
def test_a_full_queue_answers_429_with_retry_after():
    busy = AsyncLLM("tiny", max_num_seqs=1)  # one running at a time, so the rest wait in the queue
    with serve_in_thread(busy, max_waiting=2) as server:
        client = openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)

        async def one():
            try:
                await client.completions.create(model="tiny", prompt="def f():", max_tokens=8, temperature=0)
                return None
            except openai.RateLimitError as e:
                return e

        async def main():
            return await asyncio.gather(*(one() for _ in range(12)))

        results = asyncio.run(main())
        refused = [e for e in results if e is not None]
        assert refused and len(refused) < len(results)  # some queued and served, the flood refused
        for e in refused:
            assert e.status_code == 429 and int(e.response.headers["Retry-After"]) >= 1
            assert "sequences are waiting and this request brings 1 (max_waiting 2)" in e.message
        assert busy.kv_stats().used_blocks == 0


@pytest.mark.timeout(60)
def test_a_scoring_request_counts_against_admission_like_a_generation():
    """max_tokens 0 queues no engine request but runs a forward per prompt: it brings prompts x n sequences
    too, counted as waiting while it is scored, and is refused with the same 400 or 429 and Retry-After."""
    llm, gate = AsyncLLM("tiny"), threading.Event()
    forward = llm.logits

    async def held_logits(ids):  # each prompt's forward waits for the test to let it go
        await asyncio.to_thread(gate.wait, 30)
        return await forward(ids)
    llm.logits = held_logits
    score = {"model": "tiny", "prompt": ["a", "b"], "max_tokens": 0, "echo": True, "logprobs": 0}
    with serve_in_thread(llm, max_waiting=2) as server:
        gate.set()
        over = post(server, "/v1/completions", {**score, "n": 2})
        assert over.status_code == 400 and "brings 4 sequences" in over.text, over.text
        gate.clear()

        async def main():
            async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
                held = asyncio.ensure_future(http.post("/v1/completions", json=score))
                await reached(lambda: server.app.state.server.admitting == 2)  # its 2 sequences are being scored
                refused = [await http.post("/v1/completions", json={**score, "prompt": "c"}),
                           await http.post("/v1/completions", json=OK)]
                gate.set()
                return refused, await held

        refused, done = asyncio.run(main())
        for r in refused:
            assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1, r.text
            assert "2 sequences are waiting and this request brings 1 (max_waiting 2)" in r.json()["error"]["message"]
        assert done.status_code == 200 and len(done.json()["choices"]) == 2
        assert server.app.state.server.admitting == 0


@pytest.mark.parametrize("argv, missing", [
    (["serve", "--host", "0.0.0.0"], "--allow-remote and --api-key"),
    (["serve", "--host", "192.168.1.5", "--api-key", "k"], "--allow-remote"),
    (["serve", "--host", "example.com", "--allow-remote"], "--api-key"),
])
def test_a_non_loopback_bind_without_the_flag_and_a_key_is_refused(argv, missing, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "not a loopback address" in err and f"Pass {missing}" in err


def test_loopback_addresses():
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.3.2.1", "::1", "localhost"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "10.0.0.1", "example.com"))


def test_a_grammar_dead_end_is_a_400_naming_the_grammar_and_min_tokens(server):
    r = post(server, "/v1/completions", {**OK, "max_tokens": 8, "guided_regex": "a", "min_tokens": 5})
    assert r.status_code == 400, r.text
    assert "regex" in r.json()["error"]["message"] and "min_tokens (5)" in r.json()["error"]["message"]
    assert post(server, "/v1/completions", OK).status_code == 200  # the server goes on
