"""Engines for the page: the model's weights are loaded once per process and shared by every run.

Each run gets a fresh engine (new knobs, an empty KV pool) built around the same loaded weights.
"""
import streamlit as st
import torch

from minillm import EngineConfig
from minillm.engine.engine import LLMEngine
from minillm.models.loader import load_model
from minillm.models.registry import DEFAULT_MODEL, bundled_models, resolve_model_path


def model_choices() -> list[str]:
    """Bundled models, the default (tiny) first when it is there, else pico."""
    names = bundled_models()
    return sorted(names, key=lambda n: (n != DEFAULT_MODEL, n != "pico", n))


@st.cache_resource(show_spinner="Loading the model once for this server...")
def load_weights(model: str, dtype: str, device: str) -> torch.nn.Module:
    return load_model(resolve_model_path(model), getattr(torch, dtype), torch.device(device))


def build_engine(config: EngineConfig) -> LLMEngine:
    weights = load_weights(config.model, str(config.torch_dtype).removeprefix("torch."), str(config.torch_device))
    return LLMEngine(config, model=weights)
