"""What the server's tests share: the tiny model offline and behind a server in a thread, a client for
it, and the helpers that post raw bodies, slow the engine down and wait for a state.

Each fixture is module-scoped, so every test file gets its own engine and server, as it did when each
file defined them. A file that needs another engine overrides `llm` (the server is built on it); one
that needs other server options defines its own `server`.
"""
import asyncio
import time

import httpx
import openai
import pytest

from minillm import LLM, AsyncLLM
from minillm.serve import serve_in_thread


@pytest.fixture(scope="module")
def offline():
    return LLM("tiny")


@pytest.fixture(scope="module")
def llm():
    return AsyncLLM("tiny")


@pytest.fixture(scope="module")
def server(llm):
    with serve_in_thread(llm) as handle:
        yield handle


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)


def post(server, path: str, content: str | dict, **headers) -> httpx.Response:
    """POST a JSON body (a dict), or raw text sent as JSON (to send what no client would)."""
    if isinstance(content, dict):
        return httpx.post(server.base_url + path, json=content, headers=headers, timeout=60)
    return httpx.post(server.base_url + path, content=content, timeout=60,
                      headers={"content-type": "application/json", **headers})


def slowed(llm: AsyncLLM, seconds: float) -> AsyncLLM:
    """Each engine step takes at least `seconds`: a long generation stays open while a test acts."""
    step = llm.engine.step

    def slow_step():
        time.sleep(seconds)
        return step()
    llm.engine.step = slow_step
    return llm


async def reached(condition, timeout: float = 10.0) -> None:
    """Wait, without blocking the loop, until the server is in the state a test needs (no fixed sleep:
    under a loaded CI machine a request can take longer than any guess to arrive)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the server never reached the state the test waits for"
        await asyncio.sleep(0.01)
