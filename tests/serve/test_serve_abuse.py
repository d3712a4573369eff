"""The abuse suite (issue 50): hostile requests of every class, drawn at random from a seed against a live
tiny server. After each case /health answers within a second, no sequence runs and no KV block is held
(read from /metrics), and the process's memory stays within a bound.

    MINILLM_ABUSE_CASES=500 python -m pytest -q -p no:cacheprovider tests/serve/test_serve_abuse.py   # a long run

These checks see the server, not a neighbour: what stop-string floods and dead-ending grammars do to other
streams is for the isolation tests (tests/serve/test_serve_isolation.py, tests/engine/test_engine_isolation.py)."""
import json
import os
import random
import resource
import time

import httpx
import pytest
from test_serve_bounds import closed_within, raw, wide_schema

from minillm import AsyncLLM
from minillm.serve import serve_in_thread
from minillm.serve.connection_limits import ConnectionLimits
from minillm.structured.grammar import GrammarLimits
from minillm.testing import wait_until

CASES = int(os.environ.get("MINILLM_ABUSE_CASES", "24"))
RSS_GROWTH_BOUND_MB = 600  # the grammar cache's budget below (64 MiB) + the engine's steady state + slack


@pytest.fixture(scope="module")
def server():
    limits = ConnectionLimits(header_timeout_s=1.0, read_timeout_s=0.5)
    grammars = GrammarLimits(compile_timeout_s=1.0, cache_bytes=64 * 2**20)
    with serve_in_thread(AsyncLLM("tiny"), connection_limits=limits, grammar_limits=grammars) as handle:
        yield handle


def post(server, body, **kw) -> httpx.Response:
    content = body if isinstance(body, (str, bytes)) else json.dumps(body)
    kw.setdefault("timeout", 120)
    return httpx.post(server.base_url + "/v1/completions", content=content,
                      headers={"content-type": "application/json"}, **kw)


def plain(**extra) -> dict:
    return {"model": "tiny", "prompt": "hello", "max_tokens": 4, **extra}


def bad_json(server, rng):
    return post(server, '{"model": "tiny", "prompt": ' + rng.choice(['"x', "[1,", "nul", "}"]))


def deep_json(server, rng):
    depth = rng.randint(550, 800)  # deeper, the JSON parser refuses it (400)
    return post(server, '{"model": "tiny", "prompt": "x", "metadata": ' + "[" * depth + "]" * depth + "}")


def huge_headers(server, rng):
    sock = raw(server)
    try:
        big = b"a" * rng.randint(70_000, 2_000_000)
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + big + b"\r\n\r\n")
    except (BrokenPipeError, ConnectionResetError):
        pass
    assert closed_within(sock, 3.0)


def slow_body(server, rng):
    sock = raw(server)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n{\"model\"")
    assert closed_within(sock, 3.0)


def partial_header(server, rng):
    sock = raw(server)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nContent-")
    assert closed_within(sock, 3.0)


def grammar_bomb(server, rng):
    schema = wide_schema(rng.randint(900, 1100), f"b{rng.random()}")
    return post(server, plain(response_format={"type": "json_schema", "json_schema": {"name": "b", "schema": schema}}))


def varied_schema(server, rng):
    schema = wide_schema(rng.randint(1, 30), f"v{rng.random()}")
    return post(server, plain(response_format={"type": "json_schema", "json_schema": {"name": "v", "schema": schema}}))


def scoring_flood(server, rng):
    prompts = [[rng.randrange(1, 500) for _ in range(rng.randint(50, 300))] for _ in range(rng.randint(1, 8))]
    return post(server, {"model": "tiny", "prompt": prompts, "max_tokens": 0, "echo": True, "logprobs": 20,
                         "n": rng.randint(1, 8)})


def scoring_then_leave(server, rng):
    with pytest.raises(httpx.ReadTimeout):
        post(server, {"model": "tiny", "prompt": [[7] * 400] * 16, "max_tokens": 0, "echo": True,
                      "logprobs": 20, "n": 16}, timeout=0.3)


def disconnect_mid_stream(server, rng):
    with httpx.stream("POST", server.base_url + "/v1/completions", timeout=60,
                      json=plain(max_tokens=200, ignore_eos=True, stream=True, n=rng.randint(1, 4))) as r:
        next(r.iter_lines())


def logit_bias_junk(server, rng):
    return post(server, plain(logit_bias={rng.choice(["²", "١٢", "-1", "1e3", " 5", "x"]): 1}))


def stop_flood(server, rng):
    return post(server, plain(stop=[f"s{i}" for i in range(100_000)], max_tokens=16))


def dead_end_grammar(server, rng):
    return post(server, plain(guided_regex="a", min_tokens=5))


CLASSES = [bad_json, deep_json, huge_headers, slow_body, partial_header, grammar_bomb, varied_schema, scoring_flood,
           scoring_then_leave, disconnect_mid_stream, logit_bias_junk, stop_flood, dead_end_grammar]


def rss_mb() -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS")) / 1024


def idle(server) -> bool:
    metrics = httpx.get(server.base_url + "/metrics", timeout=5).text
    values = {line.split()[0]: float(line.split()[1]) for line in metrics.splitlines() if line.startswith("minillm_")}
    return values.get("minillm_num_requests_running") == 0 and values.get("minillm_kv_cache_usage_ratio") == 0


def check_unharmed(server, case) -> None:
    start = time.monotonic()
    assert httpx.get(server.base_url + "/health", timeout=5).status_code == 200
    assert time.monotonic() - start < 1.0, f"/health took {time.monotonic() - start:.2f} s after {case.__name__}"
    assert wait_until(lambda: idle(server), timeout=15), f"sequences or KV blocks left after {case.__name__}"


def run_case(server, case, rng) -> None:
    response = case(server, rng)
    if response is not None:
        assert response.status_code < 500, f"{case.__name__}: {response.status_code} {response.text[:200]}"
    check_unharmed(server, case)


@pytest.mark.slow  # ~20 s for the default 24 cases on a 2-core machine
def test_random_hostile_requests_leave_the_server_healthy(server):
    rng = random.Random(int(os.environ.get("MINILLM_ABUSE_SEED", "50")))
    run_case(server, varied_schema, rng)  # the first structured request builds the compiler: not growth
    baseline = rss_mb()
    for _ in range(CASES):
        run_case(server, rng.choice(CLASSES), rng)
    growth = rss_mb() - baseline
    assert growth < RSS_GROWTH_BOUND_MB, f"RSS grew {growth:.0f} MB over {CASES} cases"
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"abuse: {CASES} cases, RSS {baseline:.0f} -> {rss_mb():.0f} MB, peak {peak:.0f} MB")
