"""The OpenAPI schema and the server agree: a body the schema admits is not refused for a field's value
the schema could have named, and a body it refuses is refused by the server too (a 400), so a client or a
fuzzer that trusts /openapi.json sends only what is accepted. logit_bias keys are ASCII digits."""
import httpx
import jsonschema
import pytest
from serve_helpers import post

OK = {"model": "tiny", "prompt": "def f():", "max_tokens": 2}
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def request_schema(server, path: str) -> dict:
    """The request body's schema of a path, with its component definitions, as a validator reads it."""
    spec = httpx.get(server.base_url + "/openapi.json").json()
    body = spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    return {**body, "components": spec["components"]}


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {**OK, "prompt": ""}),
    ("/v1/completions", {**OK, "prompt": []}),
    ("/v1/completions", {**OK, "prompt": [""]}),
    ("/v1/completions", {**OK, "prompt": [[]]}),
    ("/v1/completions", {**OK, "prompt": [-1]}),
    ("/v1/completions", {**OK, "suffix": "x"}),
    ("/v1/completions", {**OK, "stop": [""]}),
    ("/v1/completions", {**OK, "logit_bias": {"²": 1}}),
    ("/v1/completions", {**OK, "logit_bias": {"١٢": 1}}),
    ("/v1/chat/completions", {**CHAT, "tool_choice": {}}),
    ("/v1/chat/completions", {**CHAT, "tool_choice": "required"}),
])
def test_what_the_schema_refuses_the_server_refuses(server, path, body):
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(body, request_schema(server, path))
    assert post(server, path, body).status_code == 400


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {**OK, "prompt": [[1, 2], [3]], "suffix": "", "stop": ["\n"], "logit_bias": {"12": 5}}),
    ("/v1/chat/completions", {**CHAT, "tool_choice": "none", "tools": [{"type": "function", "function": {
        "name": "f"}}]}),
    ("/v1/chat/completions", {**CHAT, "tool_choice": "auto"}),
])
def test_what_the_schema_admits_the_server_answers(server, path, body):
    jsonschema.validate(body, request_schema(server, path))
    assert post(server, path, body).status_code == 200


@pytest.mark.parametrize("key", ["²", "١٢", "12\n", " 12", "+1", "1_000"])
def test_logit_bias_keys_are_ascii_digits_in_the_servers_words(server, key):
    r = post(server, "/v1/completions", {**OK, "logit_bias": {key: 1}})
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert "logit_bias keys must be token ids written as decimal strings of the ASCII digits 0-9" in message
    assert "invalid literal" not in message
