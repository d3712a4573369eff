"""No request can hurt the others or the server: a client that gives up frees its sequences at once, a
large body is refused (413) and a long prompt never stalls the event loop, input that is not valid
Unicode is a 400 (no input gives a 500, and a 500 is counted), an empty JSON schema still
constrains, admission counts sequences and estimates its wait from the busy drain rate, and the
streams still open when a shutdown's grace period ends get an error event and [DONE]."""
import asyncio
import json
import random
import socket
import string
import threading
import time

import httpx
import openai
import pytest
from fastapi import FastAPI
from serve_helpers import reached, slowed

from minillm import AsyncLLM
from minillm.serve import serve_in_thread
from minillm.serve.admission import DrainRate, admit
from minillm.serve.protocol import CompletionRequest
from minillm.serve.server import app_in_thread
from minillm.structured import StructuredOutput
from minillm.testing import wait_until


@pytest.fixture(scope="module")
def llm():
    return slowed(AsyncLLM("tiny"), 0.01)


@pytest.fixture(scope="module")
def server(llm):
    with serve_in_thread(llm, max_body_bytes=64_000) as handle:
        yield handle


def requests_counted(server, status: str, endpoint: str = "/v1/completions") -> float:
    text = httpx.get(server.base_url + "/metrics").text
    line = f'minillm_requests_total{{endpoint="{endpoint}",status="{status}"}}'
    return next((float(x.split()[-1]) for x in text.splitlines() if x.startswith(line)), 0.0)


def test_a_client_that_gives_up_on_a_whole_answer_frees_its_sequences(server, llm):
    """n = 4 with no max_tokens on chat: four sequences to the end of the context, unless aborted."""
    chat = "/v1/chat/completions"
    ok, gone = requests_counted(server, "200", chat), requests_counted(server, "499", chat)
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "n": 4, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=1.0)
    assert wait_until(lambda: llm.num_running == 0 and llm.kv_stats().used_blocks == 0, timeout=3.0)
    assert wait_until(lambda: requests_counted(server, "499", chat) == gone + 1)
    assert requests_counted(server, "200", chat) == ok


def test_a_body_over_the_cap_is_a_413_with_or_without_content_length(server):
    body = json.dumps({"model": "tiny", "prompt": "x" * 70_000}).encode()
    declared = httpx.post(server.base_url + "/v1/completions", content=body,
                          headers={"content-type": "application/json"})
    chunked = httpx.post(server.base_url + "/v1/completions", content=iter([body[:40_000], body[40_000:]]),
                         headers={"content-type": "application/json"})
    for r in (declared, chunked):
        assert r.status_code == 413, r.text
        assert "over the limit of 64000 bytes" in r.json()["error"]["message"]


def test_a_long_prompt_is_refused_without_stalling_the_event_loop():
    """A 1 MB prompt is tokenized in a worker thread: /health answers meanwhile. On the event loop, this
    prompt held /health 1.1 s on the tiny model's tokenizer (7.5 s was reported on a larger one), as long as the
    request itself took. Relative to that request, so that a busy machine slows both alike: no wall-clock bound."""
    rng = random.Random(0)  # varied words: a repeated line tokenizes too fast to show the stall
    prompt = " ".join("".join(rng.choices(string.ascii_lowercase, k=rng.randint(1, 9))) for _ in range(200_000))
    with serve_in_thread(AsyncLLM("tiny")) as server:
        result = {}

        def big():
            start = time.monotonic()
            result["r"] = httpx.post(server.base_url + "/v1/completions", timeout=120,
                                     json={"model": "tiny", "prompt": prompt, "max_tokens": 2})
            result["seconds"] = time.monotonic() - start
        thread = threading.Thread(target=big)
        thread.start()
        slowest = 0.0
        while thread.is_alive():
            start = time.monotonic()
            assert httpx.get(server.base_url + "/health", timeout=30).status_code == 200
            slowest = max(slowest, time.monotonic() - start)
            time.sleep(0.01)
        thread.join()
        assert result["r"].status_code == 400 and "exceeds the context length" in result["r"].text
        # Reading and parsing the 1 MB body stays on the loop (a small part); tokenizing it must not.
        assert slowest < 0.5 * result["seconds"], (f"/health took {slowest:.2f} s while the {result['seconds']:.2f} s "
                                                   f"request's prompt was tokenized")


@pytest.mark.parametrize("path, raw, field", [
    ("/v1/completions", '{"model": "tiny", "prompt": "\\ud800", "max_tokens": 2}', "prompt"),
    ("/v1/completions", '{"model": "tiny", "prompt": ["ok", "a\\udfffb"], "max_tokens": 2}', "prompt.1"),
    ("/v1/completions", '{"model": "tiny", "prompt": "x", "stop": ["\\ud83d"], "max_tokens": 2}', "stop.0"),
    ("/v1/chat/completions", '{"model": "tiny", "messages": [{"role": "user", "content": [{"type": "text", '
     '"text": "\\udc00"}]}]}', "messages.0.content.0.text"),
])
def test_a_string_that_is_not_unicode_is_a_400_naming_where(server, path, raw, field):
    r = httpx.post(server.base_url + path, content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert f"{field} holds a string that is not valid Unicode" in r.json()["error"]["message"]


def test_a_server_error_is_counted_in_the_request_metrics(server, monkeypatch):
    before = requests_counted(server, "500")

    def broken(body):
        raise RuntimeError("a bug")
    monkeypatch.setattr(server.app.state.server, "check_model", broken)
    r = httpx.post(server.base_url + "/v1/completions", json={"model": "tiny", "prompt": "x"})
    assert r.status_code == 500 and "RuntimeError" in r.json()["error"]["message"]
    assert requests_counted(server, "500") == before + 1


def test_an_empty_json_schema_constrains_to_any_json_value(server):
    assert CompletionRequest.model_validate({"model": "tiny", "prompt": "{", "response_format": {
        "type": "json_schema", "json_schema": {"name": "any", "schema": {}}}}).structured() == \
        StructuredOutput(json_schema={})
    body = {"model": "tiny", "prompt": "{", "max_tokens": 40, "temperature": 0}
    free = httpx.post(server.base_url + "/v1/completions", json=body, timeout=60).json()["choices"][0]
    fmt = {"type": "json_schema", "json_schema": {"name": "any", "schema": {}}}
    bound = httpx.post(server.base_url + "/v1/completions", json={**body, "response_format": fmt},
                       timeout=60).json()["choices"][0]
    with pytest.raises(json.JSONDecodeError):
        json.loads(free["text"])  # the free model's greedy text is not JSON
    assert bound["finish_reason"] == "stop"
    json.loads(bound["text"])


def test_admission_counts_the_sequences_a_request_brings():
    llm = slowed(AsyncLLM("tiny", max_num_seqs=2), 0.02)
    with serve_in_thread(llm, max_waiting=4) as server:
        body = {"model": "tiny", "max_tokens": 30, "ignore_eos": True}
        many = httpx.post(server.base_url + "/v1/completions", json={**body, "prompt": ["a"] * 200, "n": 4})
        assert many.status_code == 400 and "brings 800 sequences" in many.text
        client = openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key="-", max_retries=0)

        async def main():
            running = asyncio.ensure_future(client.completions.create(model="tiny", prompt="a", max_tokens=60,
                                                                      extra_body={"ignore_eos": True}))
            await reached(lambda: llm.num_running == 1)  # it runs (60 steps of >= 20 ms): max_num_seqs 2
            queued = asyncio.ensure_future(client.completions.create(model="tiny", prompt=["b", "c"], n=2,
                                                                     max_tokens=2))
            await reached(lambda: llm.num_waiting_seqs == 4)  # its four sequences wait: the queue is full
            with pytest.raises(openai.RateLimitError, match="4 sequences are waiting"):
                await client.completions.create(model="tiny", prompt="d", max_tokens=2)
            return await asyncio.gather(running, queued)

        done = asyncio.run(main())
        assert len(done[1].choices) == 4


def test_the_drain_rate_counts_busy_time_only(monkeypatch):
    """A burst of 40 completions in 4 s after a minute idle drains 10/s, not 40 per 30 s window."""
    now = [0.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    drain = DrainRate()
    drain.record()  # one, a minute before the burst
    for i in range(40):
        now[0] = 60.0 + i * 0.1
        drain.record()
    assert drain.rate() == pytest.approx(10.0, rel=0.03)
    assert admit(44, 4, drain.rate()) == 5.0  # 41 over at 10/s: 4.1 -> 5 s, not the 207 s of before


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_streams_open_when_the_grace_period_ends_get_an_error_event_and_done():
    llm = slowed(AsyncLLM("tiny"), 0.05)  # 400 tokens: 20 s, past the 5 s grace of serve_in_thread
    server = serve_in_thread(llm)
    body = {"model": "tiny", "prompt": "def f():", "max_tokens": 400, "ignore_eos": True, "stream": True}
    lines = []
    with httpx.stream("POST", server.base_url + "/v1/completions", json=body, timeout=30) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                lines.append(line[6:])
            if len(lines) == 2:
                threading.Thread(target=server.stop, daemon=True).start()
    server.thread.join(15)
    assert lines[-1] == "[DONE]"
    error = json.loads(lines[-2])["error"]
    assert error["type"] == "service_unavailable" and "grace period ended" in error["message"]
    assert 3 < len(lines) < 400 and not server.thread.is_alive()
    assert llm.kv_stats().used_blocks == 0


@pytest.mark.timeout(30)
def test_a_connection_accepted_while_the_loop_was_busy_is_closed_by_the_shutdown():
    """uvicorn's shutdown closes the connections it knows of; one the kernel accepted while the loop was
    blocked becomes a connection just after that, is served, and (unless DrainingServer closes it) stays open
    past the grace period and past the loop itself: a keep-alive client on it then hangs instead of seeing the
    server gone. It must see the connection end, and the server stop before its grace period is over."""
    app = FastAPI()

    @app.get("/block")
    async def block():
        time.sleep(0.5)  # holds the server's event loop
        return {}

    @app.get("/health")
    def health():
        return {}

    server = app_in_thread(app, grace=3.0)
    port = int(server.base_url.rsplit(":", 1)[1])

    def connect(path: str) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: test\r\n\r\n".encode())
        sock.settimeout(8)
        return sock

    blocking = connect("/block")
    time.sleep(0.1)  # the loop is blocked now
    late = connect("/health")  # accepted by the kernel, not by the loop yet
    start = time.monotonic()
    stopper = threading.Thread(target=server.stop, daemon=True)
    stopper.start()
    try:
        while late.recv(4096):
            pass
    except ConnectionResetError:  # closed with its request unread: as uvicorn closes an idle connection
        pass
    ended = time.monotonic() - start
    stopper.join(10)
    stopped = time.monotonic() - start
    blocking.close()
    late.close()
    assert ended < 2.0, f"the late connection stayed open {ended:.1f} s"
    assert stopped < 2.5 and not server.thread.is_alive(), f"the server took {stopped:.1f} s to stop (grace: 3 s)"
