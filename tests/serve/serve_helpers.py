"""Helpers the server's tests share: post a raw body, slow the engine down, wait for a state. (A module of
its own, not conftest.py: tests/app's tests import their conftest by name, and two modules named conftest
imported by one pytest process shadow each other.)"""
import asyncio
import time

import httpx

from minillm import AsyncLLM


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
