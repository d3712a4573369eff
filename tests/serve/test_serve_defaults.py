"""A default a client relies on is always servable: with no max_tokens, a chat answer may take the rest of
the context as far as the KV pool could hold it, and a completion OpenAI's 16 tokens or fewer, never
"could never fit in the KV pool". Here the pool (8 blocks of 16: 128 tokens) is smaller than the context (512)."""
import pytest
from serve_helpers import post

from minillm import AsyncLLM

POOL_TOKENS = 8 * 16


@pytest.fixture(scope="module")
def llm():
    return AsyncLLM("tiny", num_kv_blocks=8, block_size=16)


def test_chat_without_max_tokens_answers_within_the_kv_pool(server):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "count: 1 2 3"}], "ignore_eos": True}
    r = post(server, "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    assert usage["prompt_tokens"] + usage["completion_tokens"] <= POOL_TOKENS
    assert usage["completion_tokens"] > POOL_TOKENS // 2 and r.json()["choices"][0]["finish_reason"] == "length"


def test_a_completion_without_max_tokens_is_capped_by_the_room_its_prompt_leaves(server):
    prompt = list(range(1, POOL_TOKENS - 4))  # leaves 5 tokens of the pool: fewer than OpenAI's default 16
    r = post(server, "/v1/completions", {"model": "tiny", "prompt": prompt, "ignore_eos": True})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 5


def test_max_new_tokens_is_what_the_context_and_the_pool_leave(llm):
    inputs = llm.engine.input_processor
    assert inputs.max_new_tokens(10) == POOL_TOKENS - 10
    assert inputs.max_new_tokens(POOL_TOKENS) == 0 and inputs.max_new_tokens(10, n=2) < POOL_TOKENS - 10
