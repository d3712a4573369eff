"""Chat: a multi-turn conversation with the model, streamed; beside each turn, what the engine did for it."""
import streamlit as st

from minillm import SamplingParams
from minillm.models.registry import PACKAGED_MODELS
from minillm_visualizer.chat.session import HIT, NEW, ChatSession, Turn
from minillm_visualizer.shared.block_map import block_map
from minillm_visualizer.shared.controls import intro
from minillm_visualizer.shared.engines import app_models
from minillm_visualizer.shared.style import MS

COLORS = {HIT: "#55a868", NEW: "#dd8452"}
DEFAULTS = {"max_tokens": 128, "temperature": 0.2, "system": ""}

st.title("Chat")
intro("A chat model remembers nothing between requests: every turn sends the whole conversation again. The "
      "prefix cache is what makes that cheap: the earlier turns' K/V blocks are still in the pool, so only the "
      "new message and the answer are computed. Beside each turn: the prompt tokens the cache served, the time "
      "to first token, the decode speed, and the conversation's blocks in the pool.", "03",
      "paged KV cache & prefix caching")

models = app_models()
st.session_state.setdefault("k_chat_model", models[0])
for name, value in DEFAULTS.items():
    st.session_state.setdefault(f"k_chat_{name}", value)


def new_conversation() -> None:
    session = st.session_state.get("chat_session")
    if session is not None:
        session.reset()
    st.session_state.pop("chat_error", None)


c = st.columns([1.4, 1, 1.2, 1], vertical_alignment="bottom")
model = c[0].selectbox("Model", models, key="k_chat_model", on_change=new_conversation)
max_tokens = int(c[1].number_input("Max tokens per answer", 1, 512, key="k_chat_max_tokens"))
temperature = float(c[2].slider("Temperature", 0.0, 1.5, step=0.1, key="k_chat_temperature"))
c[3].button("New conversation", key="chat_b_new", icon=":material/restart_alt:", on_click=new_conversation)
system = st.text_input("System message (optional)", key="k_chat_system",
                       help="Sent first in every turn. Changing it mid-conversation changes the prompt's first tokens, "
                            "so the next turn finds nothing in the prefix cache.")

session = st.session_state.get("chat_session")
if session is None or session.model != model:
    try:
        session = ChatSession(model)
    except (ValueError, FileNotFoundError) as exc:
        st.error(f"Cannot load {model}: {exc}", icon=":material/error:")
        st.stop()
    st.session_state["chat_session"] = session
if model in PACKAGED_MODELS:
    st.caption(f"{model} is a real instruct model; its own chat template writes the prompt.")
elif session.template.is_default:
    st.caption(f"{model} is a small code model with no chat template: each turn is written as `role: content` "
               "lines, and it continues them with Python rather than answering. Hits come in whole blocks of "
               f"{session.engine.config.cache.block_size} tokens: a first turn shorter than a block leaves none to "
               "find.")


def show_answer(slot, text: str) -> None:
    """A code model's answer as code (Markdown would eat its indentation), a chat model's as Markdown."""
    if session.template.is_default:
        slot.code(text or " ", language="python", wrap_lines=True)
    else:
        slot.markdown(text or "*(nothing)*")


def what_the_engine_did(turn: Turn, number: int) -> None:
    """The turn's prefix-cache hits, latency and decode speed, and the pool at its last step."""
    m = st.columns(3)
    m[0].metric("Cache hits", f"{turn.cached_tokens} of {turn.prompt_tokens}",
                help="Prompt tokens whose K/V the pool already held from earlier turns (the prefix cache found "
                     "their blocks): not recomputed.")
    m[1].metric("TTFT", f"{turn.ttft * MS:.0f} ms" if turn.ttft is not None else "-", help="Time to first token.")
    m[2].metric("Decode", f"{turn.decode_rate:.0f} tok/s" if turn.decode_rate else "-",
                help="Decode tokens per second: 1 / TPOT.")
    if turn.kv is not None:
        st.plotly_chart(block_map(turn.kv, COLORS), key=f"chat_pool_{number}")
        size = turn.kv.block_size
        st.caption(f"Turn {number}: green **hit**: {turn.cached_tokens // size} blocks found in the prefix cache; "
                   f"orange **new**: computed for this turn · light blue: cached, not part of this prompt · grey: "
                   f"free. {turn.output_tokens} tokens, finished: {turn.finish_reason}.")


def exchange(turn: Turn, number: int) -> None:
    left, right = st.columns([1, 1])
    with left:
        st.chat_message("user").markdown(turn.user)
        show_answer(st.chat_message("assistant"), turn.answer)
    with right:
        what_the_engine_did(turn, number)


for i, turn in enumerate(session.turns):
    exchange(turn, i + 1)
if st.session_state.get("chat_error"):
    st.error(st.session_state["chat_error"], icon=":material/error:")
message = st.chat_input("Write a message", key="chat_input")
if message:
    st.session_state.pop("chat_error", None)
    params = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=0.9)
    with st.columns([1, 1])[0]:
        st.chat_message("user").markdown(message)
        slot, text = st.chat_message("assistant").empty(), ""
        try:
            for piece in session.ask(message, params, system):  # the answer as the engine writes it
                text += piece
                show_answer(slot, text)
        except ValueError as exc:
            st.session_state["chat_error"] = f"Cannot answer: {exc}"
    st.rerun()  # redraw the turn with the engine's figures beside it
