"""What one request or connection may cost (issue 50): a grammar compile holds up no other request and
is bounded in time, compiled grammars are bounded in bytes, headers in size, and a half-sent request
in time."""
import socket
import threading
import time

import httpx
import pytest

from minillm import AsyncLLM
from minillm.serve import serve_in_thread
from minillm.serve.connection_limits import ConnectionLimits
from minillm.structured import StructuredOutput
from minillm.structured.grammar import GrammarLimits
from minillm.testing import wait_until


def wide_schema(properties: int, tag: str = "p") -> dict:
    """A json_schema whose compile time grows faster than its number of properties (seconds at 1,000)."""
    return {"type": "object", "properties": {f"{tag}{i}": {"type": "string"} for i in range(properties)}}


@pytest.fixture(scope="module")
def server():
    limits = ConnectionLimits(max_header_bytes=16_384, header_timeout_s=1.0, read_timeout_s=1.0)
    with serve_in_thread(AsyncLLM("tiny"), connection_limits=limits,
                         grammar_limits=GrammarLimits(compile_timeout_s=1.5, cache_bytes=4_000_000)) as handle:
        yield handle


def complete(server, **extra) -> httpx.Response:
    return httpx.post(server.base_url + "/v1/completions", timeout=120,
                      json={"model": "tiny", "prompt": "hi", "max_tokens": 1, **extra})


def test_a_plain_request_does_not_wait_for_a_grammar_compile(server):
    bomb = threading.Thread(target=complete, args=(server,), kwargs={"response_format": {
        "type": "json_schema", "json_schema": {"name": "bomb", "schema": wide_schema(1000, "bomb")}}})
    bomb.start()
    time.sleep(0.5)  # the compile has started
    start = time.monotonic()
    assert complete(server).status_code == 200
    assert time.monotonic() - start < 1.0
    bomb.join()


def test_a_compile_past_the_limit_is_a_400_naming_it(server):
    start = time.monotonic()
    r = complete(server, response_format={"type": "json_schema", "json_schema": {
        "name": "bomb", "schema": wide_schema(1000, "slow")}})
    assert r.status_code == 400
    assert "1.5 s (--grammar-compile-timeout)" in r.json()["error"]["message"]
    assert time.monotonic() - start < 5.0


def test_compiled_grammars_stay_within_the_cache_budget(server):
    compiler = server.llm.engine.input_processor._grammars
    assert wait_until(lambda: not compiler._pending, timeout=120)  # the bombs above, finishing in the background
    for i in range(40):
        schema = wide_schema(20, f"k{i}_")
        assert complete(server, response_format={"type": "json_schema", "json_schema": {
            "name": "s", "schema": schema}}).status_code == 200
    cache = compiler.cache
    assert 0 < cache.bytes <= cache.budget_bytes == 4_000_000
    assert len(cache) < 40  # the oldest were evicted


def test_one_compile_serves_every_request_for_the_same_spec():
    from minillm.models.registry import resolve_model_path
    from minillm.structured.grammar import GrammarCompiler
    compiler = GrammarCompiler(resolve_model_path("tiny"), 512, (0,), GrammarLimits(compile_timeout_s=60))
    spec = StructuredOutput(json_schema=wide_schema(200, "shared"))
    found = []
    threads = [threading.Thread(target=lambda: found.append(compiler.compile(spec))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(found) == 4 and all(g is found[0] for g in found)


def raw(server) -> socket.socket:
    host, port = server.base_url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def closed_within(sock: socket.socket, seconds: float) -> bool:
    """The server answered and/or closed the connection within seconds."""
    sock.settimeout(seconds)
    try:
        while sock.recv(65536):
            pass
        return True
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def test_oversize_headers_are_refused_and_the_connection_closed(server):
    sock = raw(server)
    start = time.monotonic()
    try:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 1_000_000 + b"\r\n\r\n")
    except (BrokenPipeError, ConnectionResetError):
        pass  # closed while we were still sending: refused
    assert closed_within(sock, 3.0) and time.monotonic() - start < 3.0


def test_oversize_headers_read_whole_in_one_go_are_a_431(server):
    r = httpx.get(server.base_url + "/health", headers={"x-big": "a" * 20_000}, timeout=5)
    assert r.status_code == 431 and "--max-header-bytes" in r.json()["error"]["message"]


def test_a_partial_header_is_closed_after_the_header_timeout(server):
    sock = raw(server)
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
    assert closed_within(sock, 3.0)


def test_a_silent_connection_is_closed_after_the_header_timeout(server):
    assert closed_within(raw(server), 3.0)


def test_a_body_shorter_than_its_content_length_gets_a_408(server):
    sock = raw(server)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 1000\r\n\r\n{\"model\": \"tiny\"")
    sock.settimeout(5.0)
    answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 408") and b"--read-timeout" in answer + sock.recv(65536)
    assert closed_within(sock, 3.0)
    assert httpx.get(server.base_url + "/health", timeout=1).status_code == 200
