"""Engines for the page: the model's weights are loaded once per process and shared by every run.

LLMEngine loads its model in its constructor. Building a fresh engine for each run (new knobs, an
empty KV pool) would reload the weights each time, so while one is built we hand it the weights
already loaded instead. (An LLMEngine(config, model=...) argument would make this unnecessary.)
"""
import threading
from unittest import mock

import streamlit as st
import torch

import minillm.engine.engine as engine_module
from minillm import EngineConfig
from minillm.engine.engine import LLMEngine
from minillm.models.loader import load_model
from minillm.models.registry import DEFAULT_MODEL, bundled_models, resolve_model_path

_building = threading.Lock()


def model_choices() -> list[str]:
    """Bundled models, the default (tiny) first when it is there, else pico."""
    names = bundled_models()
    return sorted(names, key=lambda n: (n != DEFAULT_MODEL, n != "pico", n))


@st.cache_resource(show_spinner="Loading the model once for this server...")
def load_weights(model: str, dtype: str, device: str) -> torch.nn.Module:
    return load_model(resolve_model_path(model), getattr(torch, dtype), torch.device(device))


def build_engine(config: EngineConfig) -> LLMEngine:
    weights = load_weights(config.model, str(config.torch_dtype).removeprefix("torch."), str(config.torch_device))
    with _building, mock.patch.object(engine_module, "load_model", lambda *args, **kwargs: weights):
        return LLMEngine(config)
