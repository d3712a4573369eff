"""Engines for the page: the model's weights are loaded once per process and shared by every run.

Each run gets a fresh engine (new knobs, an empty KV pool) built around the same loaded weights.

Which models the pages offer: the cluster page measures the bundled models (`model_choices`); every other page
also offers the installed real model (`app_models`), and starts on it: the app's default model is the real one
when its package is installed, else tiny. MINILLM_APP_MODEL names another default (the app's tests set it to
tiny). The technique pages size their work for a real model (shared/sizing.py).
"""
import os

import streamlit as st
import torch

from minillm import EngineConfig
from minillm.engine.engine import LLMEngine
from minillm.models.prepare import load_model
from minillm.models.registry import DEFAULT_MODEL, available_models, bundled_models, preferred_model, resolve_model_path

APP_MODEL_ENV = "MINILLM_APP_MODEL"


def model_choices() -> list[str]:
    """Bundled models, the default (tiny) first when it is there, else pico."""
    names = bundled_models()
    return sorted(names, key=lambda n: (n != DEFAULT_MODEL, n != "pico", n))


def app_default_model() -> str:
    """MINILLM_APP_MODEL when set, else the real model when installed, else tiny."""
    return os.environ.get(APP_MODEL_ENV) or preferred_model()


def app_models() -> list[str]:
    """The bundled and the installed real models, the app's default first, then as model_choices orders them."""
    names = model_choices() + [n for n in available_models() if n not in bundled_models()]
    default = app_default_model()
    return sorted(names, key=lambda n: n != default)  # a stable sort: the rest keep their order


@st.cache_resource(show_spinner="Loading the model once for this server...")
def load_weights(model: str, dtype: str, device: str) -> torch.nn.Module:
    return load_model(resolve_model_path(model), getattr(torch, dtype), torch.device(device))


def build_engine(config: EngineConfig) -> LLMEngine:
    weights = load_weights(config.model, str(config.torch_dtype).removeprefix("torch."), str(config.torch_device))
    return LLMEngine(config, model=weights)
