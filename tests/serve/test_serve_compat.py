"""What OpenAI's clients and the evaluation tools send is accepted as they send it: content as a list of
parts, standard fields at their neutral values and null for a default, stream_options'
continuous_usage_stats, echo and max_tokens 0 (the prompt's log-probabilities equal the model's own
logits), GET /v1/models/{id} through the official client, and HEAD on /health and /metrics."""
import httpx
import openai
import pytest
from serve_helpers import post

from minillm import SamplingParams
from minillm.serve.protocol import CompletionRequest


def test_text_parts_are_joined_in_order_and_a_tool_calling_turn_may_have_no_content(client):
    def reply(messages):
        return client.chat.completions.create(model="tiny", messages=messages, max_tokens=8, temperature=0,
                                              extra_body={"ignore_eos": True}).choices[0].message.content
    parts = [{"type": "text", "text": "def add"}, {"type": "text", "text": "(a, b):"}]
    assert reply([{"role": "user", "content": parts}]) == reply([{"role": "user", "content": "def add(a, b):"}])
    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}}
    with_tools = [{"role": "user", "content": "x"}, {"role": "assistant", "content": None, "tool_calls": [call]},
                  {"role": "tool", "content": "3", "tool_call_id": "c1"}]
    plain = [{"role": "user", "content": "x"}, {"role": "assistant", "content": ""},
             {"role": "tool", "content": "3"}]
    assert reply(with_tools) == reply(plain)


NEUTRAL_FIELDS = {"presence_penalty": 0, "frequency_penalty": 0.0, "repetition_penalty": 1.0, "logit_bias": {},
                  "min_tokens": 0, "best_of": 1, "suffix": "", "metadata": {"run": "7"}, "store": False,
                  "user": "u-1", "service_tier": "auto", "temperature": None, "top_p": None, "n": None,
                  "logprobs": None, "stream": None, "stream_options": None}


def test_standard_fields_at_neutral_values_change_nothing(server, offline):
    expected = offline.generate("def fib(n):", SamplingParams(max_tokens=10, temperature=0, ignore_eos=True))[0]
    base = {"model": "tiny", "prompt": "def fib(n):", "max_tokens": 10, "ignore_eos": True}
    r = post(server, "/v1/completions", {**base, **NEUTRAL_FIELDS, "temperature": 0})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == expected.text
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}], "tool_choice": "none",
            "parallel_tool_calls": False, "logprobs": None, "top_logprobs": None,
            **{k: v for k, v in NEUTRAL_FIELDS.items() if k not in ("best_of", "suffix", "logprobs")}}
    r = post(server, "/v1/chat/completions", chat)
    assert r.status_code == 200, r.text


def test_set_penalties_reach_sampling_params_by_their_names(server, offline):
    """Non-neutral penalties go to the engine under SamplingParams' names, logit_bias keyed by int ids:
    the server's output equals the offline engine's under the same params, and differs without them."""
    asked = {"presence_penalty": 0.5, "frequency_penalty": 1.5, "repetition_penalty": 1.3,
             "logit_bias": {"7": 5.0, "11": -100}, "min_tokens": 4}
    params = CompletionRequest.model_validate({"model": "tiny", "prompt": "x", **asked}).sampling_params(
        12, None, vocab_size=100)
    assert {k: getattr(params, k) for k in asked} == {**asked, "logit_bias": {7: 5.0, 11: -100}}
    prompt, greedy = "x = [1, 1, 1, 1,", dict(max_tokens=12, temperature=0)
    expected = offline.generate(prompt, SamplingParams(**greedy, **{**asked, "logit_bias": {7: 5.0, 11: -100}}))
    plain = offline.generate(prompt, SamplingParams(**greedy))
    r = post(server, "/v1/completions", {"model": "tiny", "prompt": prompt, **greedy, **asked})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == expected[0].text != plain[0].text
    bad = post(server, "/v1/completions", {"model": "tiny", "prompt": prompt, "logit_bias": {"100000": 1}})
    assert bad.status_code == 400 and "token ids are 0 to" in bad.json()["error"]["message"]


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": "def f():"}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "def f():"}]}),
])
def test_continuous_usage_stats_puts_the_usage_so_far_in_every_chunk(server, path, body):
    request = {"model": "tiny", **body, "max_tokens": 6, "temperature": 0, "ignore_eos": True, "stream": True,
               "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    chunks = []
    with httpx.stream("POST", server.base_url + path, json=request, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(httpx.Response(200, content=line[6:]).json())
    assert all(c["usage"] is not None for c in chunks)
    completion = [c["usage"]["completion_tokens"] for c in chunks]
    assert completion == sorted(completion) and completion[-1] == 6
    assert len({c["usage"]["prompt_tokens"] for c in chunks}) == 1 and chunks[-1]["choices"] == []


@pytest.mark.parametrize("max_tokens", [0, 1])
def test_echo_returns_the_prompt_with_the_models_own_logprobs(server, offline, max_tokens):
    """lm-eval's loglikelihood request: token i's logprob is log_softmax(logits[i - 1])[token i]."""
    prompt = "def fib(n):\n    return"
    ids = offline.tokenizer.encode(prompt)
    r = post(server, "/v1/completions", {"model": "tiny", "prompt": prompt, "echo": True, "logprobs": 1,
                                         "max_tokens": max_tokens, "temperature": 0})
    assert r.status_code == 200, r.text
    choice, usage = r.json()["choices"][0], r.json()["usage"]
    assert choice["text"].startswith(prompt) and usage["completion_tokens"] == max_tokens
    lp = choice["logprobs"]
    assert len(lp["token_logprobs"]) == len(ids) + max_tokens and lp["token_logprobs"][0] is None
    assert lp["top_logprobs"][0] is None and "".join(lp["tokens"][:len(ids)]) == prompt
    reference = offline.logits(ids).log_softmax(-1)  # [len, vocab]
    for i in range(1, len(ids)):
        assert lp["token_logprobs"][i] == pytest.approx(float(reference[i - 1, ids[i]]), abs=1e-4)
        assert max(lp["top_logprobs"][i].values()) == pytest.approx(float(reference[i - 1].max()), abs=1e-4)
    if max_tokens:  # the generated token's logprob comes from the last prompt position
        assert lp["token_logprobs"][-1] == pytest.approx(float(reference[-1].max()), abs=1e-3)
        assert lp["text_offset"][len(ids)] == len(prompt)


def test_max_tokens_0_scores_token_prompts_without_generating(server):
    r = post(server, "/v1/completions", {"model": "tiny", "prompt": [[5, 6, 7], [8, 9]], "max_tokens": 0,
                                         "echo": True, "logprobs": 0, "n": 2})
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2, 3]
    assert [len(c["logprobs"]["token_logprobs"]) for c in choices] == [3, 3, 2, 2]
    assert all(c["finish_reason"] == "length" for c in choices) and r.json()["usage"]["completion_tokens"] == 0
    too_long = post(server, "/v1/completions", {"model": "tiny", "prompt": [1] * 600, "max_tokens": 0,
                                                "echo": True, "logprobs": 0})
    assert too_long.status_code == 400 and "context length" in too_long.json()["error"]["message"]


def test_the_model_is_retrieved_by_id_and_health_answers_head(client, server):
    assert client.models.retrieve("tiny").id == "tiny"
    with pytest.raises(openai.NotFoundError, match="model 'gpt-4' does not exist"):
        client.models.retrieve("gpt-4")
    for path in ("/health", "/metrics"):
        r = httpx.head(server.base_url + path)
        assert r.status_code == 200 and r.content == b""
