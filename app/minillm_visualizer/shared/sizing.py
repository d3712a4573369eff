"""A page's work sized for its model: the bundled models answer in a blink, a real one reads hundreds of MB of
weights at every step, so the technique pages start a real model on a smaller load and say what a run costs.

    defaults   the page's knobs for the bundled models
    real       the knobs that change on a real model (fewer prompts, shorter outputs, fewer points)

The knobs live in st.session_state as k_<page>_<name>; choosing another model resets the `real` ones to that
model's values (the learner's other choices stay).
"""
import functools

import streamlit as st

from minillm.models.registry import bundled_models, resolve_model_path
from minillm_visualizer.shared.style import MIB


def is_real(model: str) -> bool:
    """A model that is not bundled: an installed real one (SmolLM2-135M), hundreds of MB in fp32."""
    return model not in bundled_models()


def sized(defaults: dict, real: dict, model: str) -> dict:
    """The page's defaults for `model`: a real model's overridden by `real`."""
    return {**defaults, **real} if is_real(model) else dict(defaults)


def knob_defaults(page: str, defaults: dict, real: dict, models: list[str]) -> None:
    """Give each of the page's knobs its default the first time it is drawn, sized for the chosen model
    (models[0] until one is chosen; a model no longer offered gives way to it)."""
    key = f"k_{page}_model"
    if st.session_state.get(key) not in models:
        st.session_state[key] = models[0]
    for name, value in sized(defaults, real, st.session_state[key]).items():
        st.session_state.setdefault(f"k_{page}_{name}", value)


def resize(page: str, defaults: dict, real: dict):
    """An on_change callback for the page's model selectbox: the knobs in `real` take the new model's values."""
    def callback() -> None:
        values = sized(defaults, real, st.session_state[f"k_{page}_model"])
        for name in real:
            st.session_state[f"k_{page}_{name}"] = values[name]
    return callback


def sequence_bound(prompt: str, max_tokens: int) -> int:
    """An upper bound on a sequence's tokens, to size a KV pool by: a byte-level BPE token covers at least one
    byte of the prompt, a BOS may open it, then the output."""
    return len(prompt.encode()) + 1 + max_tokens


@functools.lru_cache(maxsize=8)
def weights_mib(model: str) -> float:
    """The model's weights as the engine loads them (its safetensors file, fp32 for the real model), in MiB."""
    return sum(p.stat().st_size for p in resolve_model_path(model).glob("*.safetensors")) / MIB


def cost_note(model: str, work: str) -> str:
    """What a run on `model` costs, in words: `work` says how many forwards it makes (a real model only; the
    bundled ones are too small for it to matter)."""
    return (f"{model} is a real model: every forward reads its {weights_mib(model):,.0f} MiB of weights, tens of "
            f"milliseconds a step on a laptop CPU. {work}")
