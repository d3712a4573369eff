"""LLM.chat and LLM.stream_chat: a conversation rendered with the model's chat template, then generated.

On the real model (SmolLM2-135M-Instruct, skipped when its package is not installed) the prompt is
transformers' own `apply_chat_template` from the same GGUF file; on the bundled tiny model (no template of
its own) the default template is used."""
import re

import pytest

from minillm import LLM, SamplingParams
from minillm.chat_template import DEFAULT_TEMPLATE
from minillm.models import registry
from minillm.testing import gguf_parsed_once

pytestmark = pytest.mark.real_model  # its module fixture holds the real model

NAME = "smollm2-135m-instruct"
GGUF_FILE = registry.packaged_gguf(NAME)
GREEDY = SamplingParams(max_tokens=48, temperature=0)
SHORT = SamplingParams(max_tokens=12, temperature=0)  # the tiny model writes code until max_tokens
CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "You are a terse assistant who answers in one line."},
     {"role": "user", "content": "What is a KV cache?"},
     {"role": "assistant", "content": "The keys and values of past tokens, kept so they are not recomputed."},
     {"role": "user", "content": "And why does it save time?"}],
]


@pytest.fixture(scope="module")
def real(real_model_cache) -> LLM:
    """The real model, from the run's shared conversion cache."""
    if GGUF_FILE is None:
        pytest.skip(f"the real model is not installed: {registry.PACKAGED_MODELS[NAME].install_command()}")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MINILLM_CACHE", str(real_model_cache))
        return LLM(NAME)


@pytest.fixture(scope="module")
def hf_tokenizer():
    """transformers' tokenizer and chat template, read from the same GGUF file by its own converter."""
    if GGUF_FILE is None:
        pytest.skip(f"the real model is not installed: {registry.PACKAGED_MODELS[NAME].install_command()}")
    from transformers import AutoTokenizer
    with gguf_parsed_once():
        return AutoTokenizer.from_pretrained(GGUF_FILE.parent, gguf_file=GGUF_FILE.name)


@pytest.fixture(scope="module")
def tiny() -> LLM:
    return LLM("tiny")


@pytest.mark.slow
def test_the_rendered_prompt_equals_transformers_apply_chat_template(real, hf_tokenizer):
    for messages in CONVERSATIONS:
        text = hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert real.chat_template.render(messages) == text
        ids = hf_tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        out = real.chat(messages, SamplingParams(max_tokens=1), use_tqdm=False)[0]
        assert out.prompt == text and out.prompt_token_ids == ids


@pytest.mark.slow
def test_the_real_model_answers_a_greeting_in_english_and_stops_at_the_end_of_its_turn(real):
    out = real.chat(CONVERSATIONS[0], GREEDY, use_tqdm=False)[0]
    assert out.finish_reason == "stop", f"no end of turn within {GREEDY.max_tokens} tokens: {out.text!r}"
    assert out.token_ids[-1] == real.tokenizer.token_to_id("<|im_end|>")
    words = re.findall(r"[A-Za-z]+", out.text)
    assert len(words) >= 2 and out.text.isascii(), f"not an English answer: {out.text!r}"
    assert "<|im_end|>" not in out.text and "<|im_start|>" not in out.text


@pytest.mark.slow
def test_a_second_turn_finds_the_first_in_the_prefix_cache(real):
    first = real.chat(CONVERSATIONS[0], GREEDY, use_tqdm=False)[0]
    follow_up = [*CONVERSATIONS[0], {"role": "assistant", "content": first.text},
                 {"role": "user", "content": "Tell me one fact about cats."}]
    second = real.chat(follow_up, SamplingParams(max_tokens=1), use_tqdm=False)[0]  # the hits are known at prefill
    block = real.config.cache.block_size
    assert second.metrics["cached_prompt_tokens"] >= (len(first.prompt_token_ids) // block) * block > 0


def test_tiny_has_no_template_of_its_own_and_chats_with_the_default(tiny):
    assert tiny.chat_template.source == DEFAULT_TEMPLATE and tiny.chat_template.is_default
    messages = CONVERSATIONS[1]
    out = tiny.chat(messages, SHORT, use_tqdm=False)[0]
    assert out.prompt.startswith("system: You are a terse assistant") and out.prompt.endswith(
        "user: And why does it save time?\n\nassistant:")
    assert out.token_ids and out.text == tiny.generate(out.prompt, SHORT, use_tqdm=False)[0].text


def test_a_list_of_conversations_gives_one_output_each_in_order(tiny):
    outs = tiny.chat(CONVERSATIONS, [SamplingParams(max_tokens=3), SamplingParams(max_tokens=5)], use_tqdm=False)
    assert [o.prompt for o in outs] == [tiny.chat_template.render(m) for m in CONVERSATIONS]
    assert [len(o.token_ids) for o in outs] == [3, 5]
    with pytest.raises(ValueError, match="non-empty list"):  # rendered before any is queued
        tiny.chat([CONVERSATIONS[0], []])
    assert not tiny.engine.has_unfinished()


def test_stream_chat_streams_the_answer_chat_gives(tiny):
    chunks = list(tiny.stream_chat(CONVERSATIONS[0], SHORT))
    assert len(chunks) > 1 and chunks[-1].finished
    assert "".join(c.text for c in chunks) == tiny.chat(CONVERSATIONS[0], SHORT, use_tqdm=False)[0].text


@pytest.mark.parametrize("messages, says", [
    ([], "non-empty list"),
    ("Hello!", "non-empty list"),
    ([{"content": "Hello!"}], "messages\\[0\\] has no 'role'"),
    ([{"role": "user", "content": "Hi"}, {"role": "user"}], "messages\\[1\\] has no 'content'"),
    ([{"role": 3, "content": "Hello!"}], "role 3; a role is one of system, user, assistant"),
    ([{"role": "wizard", "content": "Hello!"}], "role 'wizard'"),
    ([{"role": "user", "content": None}], "content must be text, got NoneType"),
    (["Hello!"], "messages\\[0\\] must be a dict"),
])
def test_malformed_messages_raise_a_value_error_that_names_the_fault(tiny, messages, says):
    with pytest.raises(ValueError, match=says):
        tiny.chat(messages)
    with pytest.raises(ValueError, match=says):
        tiny.stream_chat(messages)
