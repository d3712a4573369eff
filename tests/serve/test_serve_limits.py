"""The limits a client could otherwise choose the cost of (serve/limits.py): each refused with a 400 that
names the limit and its flag, before the engine or a recursive validator sees the request."""
import pytest
from serve_helpers import post

from minillm.serve import serve_in_thread
from minillm.serve.limits import MAX_JSON_DEPTH, RequestLimits

OK = {"model": "tiny", "prompt": "def f():", "max_tokens": 2}


@pytest.fixture(scope="module")
def server(llm):
    with serve_in_thread(llm, limits=RequestLimits(max_stop_strings=3, max_stop_chars=20)) as handle:
        yield handle


@pytest.mark.parametrize("stop, words", [
    (["a", "b", "c", "d"], "stop has 4 strings; this server accepts at most 3 (its --max-stop-strings)"),
    (["x" * 15, "y" * 6], "the stop strings total 21 characters; this server accepts at most 20 (its --max-stop-chars"),
    ("z" * 21, "total 21 characters"),
])
def test_stop_strings_past_a_limit_are_a_400_naming_it(server, stop, words):
    r = post(server, "/v1/completions", {**OK, "stop": stop})
    assert r.status_code == 400 and words in r.json()["error"]["message"], r.text
    assert r.json()["error"]["param"] == "stop"
    assert post(server, "/v1/completions", {**OK, "stop": ["a", "b", "x" * 18]}).status_code == 200  # at the limits


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_deep_json_is_a_400_naming_the_depth_limit(server, path):
    deep = "[" * 600 + "]" * 600
    body = '{"model": "tiny", "max_tokens": 2, "metadata": ' + deep + ', "prompt": "x", "messages": []}'
    r = post(server, path, body)
    assert r.status_code == 400, r.text
    assert f"more than {MAX_JSON_DEPTH} levels deep" in r.json()["error"]["message"]


def test_json_at_the_depth_limit_is_read():
    from minillm.serve.limits import json_depth_over
    nested = []
    for _ in range(MAX_JSON_DEPTH - 1):
        nested = [nested]
    assert not json_depth_over(nested) and json_depth_over([nested])
    assert json_depth_over({"a": [{"b": nested}]}) and not json_depth_over("text")
