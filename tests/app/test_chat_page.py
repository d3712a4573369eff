"""The Chat page: a multi-turn conversation, streamed, with each turn's prefix-cache hits, TTFT, decode speed and
the pool's blocks beside it; and the model pickers, which offer the real model and start on it when installed."""
import json

import pytest
from app_pages import APP, errors, figures

from minillm.models import registry
from minillm.models.registry import bundled_models
from minillm_visualizer.chat.session import HIT, NEW
from minillm_visualizer.shared import engines
from minillm_visualizer.shared.engines import APP_MODEL_ENV, app_models

REAL = "smollm2-135m-instruct"
# Longer than a block of 16 tokens once the default template writes it, so that turn 2 has a full block to find.
FIRST = "def fibonacci(n): compute the n-th Fibonacci number with a simple loop"
SECOND = "class Stack: a stack with push and pop"


@pytest.fixture
def chat():
    """The Chat page on tiny, greedy, with short answers."""
    from streamlit.testing.v1 import AppTest
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.session_state["k_chat_temperature"] = 0.0
    at.session_state["k_chat_max_tokens"] = 12
    at.switch_page("minillm_visualizer/chat/chat.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def say(at, text: str) -> None:
    at.chat_input(key="chat_input").set_value(text).run()
    assert not at.exception, [e.value for e in at.exception]


def pool_cells(at, number: int) -> list[str]:
    """The labels of turn `number`'s pool picture (the page's charts, in turn order), one per block."""
    chart = at.get("plotly_chart")[number - 1]
    return [t for row in json.loads(chart.proto.spec)["data"][0]["text"] for t in row]


def test_the_second_turn_finds_the_first_in_the_prefix_cache(chat):
    assert chat.selectbox(key="k_chat_model").value == "tiny"
    say(chat, FIRST)
    say(chat, SECOND)
    assert not errors(chat), errors(chat)
    first, second = chat.session_state["chat_session"].turns
    assert first.cached_tokens == 0 and second.cached_tokens >= 16
    assert second.prompt_tokens > first.prompt_tokens + first.output_tokens, "turn 2 sends the whole conversation"
    assert first.answer and second.answer and first.ttft > 0 and second.decode_rate > 0
    shown = [m.value for m in chat.metric if m.label == "Cache hits"]
    assert shown == [f"0 of {first.prompt_tokens}", f"{second.cached_tokens} of {second.prompt_tokens}"]
    messages = chat.chat_message
    assert [m.markdown[0].value for m in messages[::2]] == [FIRST, SECOND]
    answers = [m.code[0].value.strip() for m in messages[1::2]]
    assert answers == [first.answer.strip(), second.answer.strip()], "a code model's answers, as code"
    assert len(chat.get("plotly_chart")) == 2, "one pool picture per turn"
    assert list(figures(chat)) == ["KV pool: 64 blocks of 16 tokens"], "two conversations at tiny's full context"
    cells = pool_cells(chat, 2)
    assert cells.count(HIT) == second.cached_tokens // 16 and cells.count(NEW) >= 1
    assert NEW in pool_cells(chat, 1) and HIT not in pool_cells(chat, 1)


def test_a_new_conversation_forgets_the_turns(chat):
    say(chat, FIRST)
    chat.button(key="chat_b_new").click().run()
    assert chat.session_state["chat_session"].turns == [] and not chat.chat_message
    say(chat, SECOND)
    session = chat.session_state["chat_session"]
    (turn,) = session.turns
    alone = session.template.render([{"role": "user", "content": SECOND}])
    assert turn.prompt_tokens == len(session.engine.tokenizer.encode(alone)), "the prompt is the new message alone"


def test_a_message_longer_than_the_context_is_refused_and_the_conversation_kept(chat):
    say(chat, FIRST)
    say(chat, "x = 1\n" * 400)
    assert any("fills the 512-token context: start a new conversation" in e for e in errors(chat)), errors(chat)
    assert len(chat.session_state["chat_session"].turns) == 1


def test_the_real_model_is_the_apps_default_when_installed(monkeypatch):
    monkeypatch.delenv(APP_MODEL_ENV)
    monkeypatch.setattr(registry, "installed_models", lambda: [REAL])
    monkeypatch.setattr(engines, "available_models", lambda: bundled_models() + [REAL])
    assert app_models()[0] == REAL and app_models()[1] == "tiny"
    monkeypatch.setenv(APP_MODEL_ENV, "pico")
    assert app_models()[0] == "pico" and REAL in app_models()
    monkeypatch.delenv(APP_MODEL_ENV)
    monkeypatch.setattr(registry, "installed_models", lambda: [])
    monkeypatch.setattr(engines, "available_models", bundled_models)
    assert app_models()[0] == "tiny" and REAL not in app_models()


def test_the_sidebar_offers_the_real_model_and_the_kv_budget_follows_the_model(app):
    options = app.sidebar.selectbox(key="k_model").options
    assert options[0] == "tiny", "the tests start on tiny"
    assert (REAL in options) == (registry.packaged_gguf(REAL) is not None)
    app.sidebar.selectbox(key="k_model").set_value("tiny").run()
    assert app.session_state["k_kv_mib"] == 6.0
    assert any(c.value == "= 64 blocks of 96 KiB for this model" for c in app.sidebar.caption)
