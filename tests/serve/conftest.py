"""What the server's tests share: the tiny model offline and behind a server in a thread, and a client for
it (the helpers that post raw bodies, slow the engine down and wait for a state: serve_helpers.py).

Each fixture is module-scoped, so every test file gets its own engine and server, as it did when each
file defined them. A file that needs another engine overrides `llm` (the server is built on it); one
that needs other server options defines its own `server`.
"""

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
