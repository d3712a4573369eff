"""Quantization for the page: the config the knobs describe, its quality and bytes against the full
model, the sensitivity grid, the KV blocks a memory budget leaves room for, and greedy generation.

The full-precision weights are the ones every engine of the app shares (shared.engines); each
candidate is a quantized copy, so the shared weights never change. Measurements are cached by their
settings: redrawing the page, or coming back to a configuration, costs nothing.
"""
import time
from collections.abc import Callable
from dataclasses import dataclass

import streamlit as st
import torch

from minillm import EngineConfig, SamplingParams
from minillm.arith import cdiv
from minillm.cache.pool import block_bytes
from minillm.config import Components
from minillm.engine.engine import LLMEngine
from minillm.experiments.quant_quality import Quality, Reference, heldout_windows
from minillm.experiments.quant_sensitivity import quantized_copy, sensitivity_grid
from minillm.models.model_config import ModelConfig
from minillm.models.registry import resolve_model_path
from minillm.quant import QuantConfig, linear_weight_bytes
from minillm.quant.quant_config import LAYER_PROJECTIONS
from minillm_visualizer.shared.engines import load_weights
from minillm_visualizer.shared.sizing import is_real

WINDOWS, WINDOW_TOKENS = 4, 256  # every figure is measured on these: 4 x 256 = 1,024 next-token predictions
# A real model scores a shorter text: its forward costs ~1,000x a bundled model's, and its [tokens, 49,152]
# log-probabilities are kept for every comparison (4 x 128 x 49,152 floats: 96 MiB).
REAL_WINDOWS, REAL_WINDOW_TOKENS = 4, 128
BLOCK_SIZE = 16


def model_config(model: str) -> ModelConfig:
    return ModelConfig.from_file(resolve_model_path(model) / "config.json")


def quant_config(scheme: str, group_size: int, layers: list[int], projections: list[str],
                 num_layers: int) -> QuantConfig:
    """The QuantConfig the knobs describe (every layer chosen: None, which keeps its label short).
    Raises ValueError, in words, for a choice that would quantize nothing."""
    if projections and not layers and "lm_head" not in projections:
        raise ValueError("no decoder layer is chosen and lm_head is not among the projections, so nothing would "
                         "be quantized: choose at least one layer")
    chosen = None if sorted(layers) == list(range(num_layers)) else tuple(layers)
    return QuantConfig(scheme, group_size=int(group_size), layers=chosen, projections=tuple(projections))


def full_model(model: str) -> torch.nn.Module:
    """The full-precision weights build_engine shares between engines (loaded once per server)."""
    config = EngineConfig(model=model)
    return load_weights(model, str(config.torch_dtype).removeprefix("torch."), str(config.torch_device))


def window_shape(model: str) -> tuple[int, int]:
    """(windows, tokens per window) of the held-out text `model` is scored on."""
    return (REAL_WINDOWS, REAL_WINDOW_TOKENS) if is_real(model) else (WINDOWS, WINDOW_TOKENS)


@st.cache_resource(show_spinner="Reading the held-out text and scoring the full-precision model (once per server)...")
def reference(model: str) -> Reference:
    """The full model's next-token log-probabilities on the held-out windows."""
    full = full_model(model)
    count, seq_len = window_shape(model)
    windows = heldout_windows(resolve_model_path(model), count=count, seq_len=seq_len)
    return Reference(full, windows.to(next(full.parameters()).device))


@dataclass(frozen=True)
class Measured:
    quality: Quality          # the quantized copy against the full model
    full: Quality             # the full model itself (KL 0, top-1 1): its perplexity is the baseline
    bytes: dict[str, int]     # linear_weight_bytes of the quantized copy
    full_bytes: dict[str, int]


@st.cache_data(show_spinner="Quantizing a copy of the model and scoring it on the held-out text...", max_entries=64)
def measure(model: str, config: QuantConfig) -> Measured:
    """Quality and weight bytes of `model` quantized as `config` says, by minillm's own codecs."""
    full, ref = full_model(model), reference(model)
    quantized = quantized_copy(full, config)
    return Measured(ref.compare(quantized), ref.quality, linear_weight_bytes(quantized), linear_weight_bytes(full))


@st.cache_data(show_spinner=False, max_entries=16)
def sensitivity(model: str, base: QuantConfig) -> list[dict]:
    """One row per (layer, projection) quantized alone with base's scheme and group size: the heatmap's cells."""
    grid = sensitivity_grid(full_model(model), reference(model), base)
    return [{"layer": layer, "projection": projection, "kl": q.kl, "perplexity": q.perplexity, "top1": q.top1}
            for (layer, projection), q in grid.items()]


def sensitivity_cells(num_layers: int) -> int:
    return num_layers * len(LAYER_PROJECTIONS)


def kv_fit(cfg: ModelConfig, weight_bytes: int, budget_bytes: int, block_size: int, dtype: torch.dtype) -> dict:
    """What a memory budget holds once the weights are in: whole KV blocks (block_bytes: the model's KV bytes
    per token times the block size), the tokens they hold, and the full-length sequences that fit."""
    per_block = block_bytes(cfg, block_size, dtype)
    blocks = max(0, budget_bytes - weight_bytes) // per_block
    return {"weights": weight_bytes, "kv": blocks * per_block, "blocks": blocks, "block_bytes": per_block,
            "tokens": blocks * block_size,
            "full_contexts": blocks // cdiv(cfg.max_position_embeddings, block_size),
            "spare": budget_bytes - weight_bytes - blocks * per_block}


@dataclass
class Generation:
    token_ids: list[int]
    pieces: list[str]         # each token's own text
    seconds: float            # stepping the engine (building it excluded)

    @property
    def ms_per_token(self) -> float:
        return 1000 * self.seconds / max(1, len(self.token_ids))


def engine_config(model: str, quantization: QuantConfig | None, components: Components | None = None,
                  tokens: int | None = None) -> EngineConfig:
    """One sequence's engine: a pool with room for its `tokens` (None: its full context), and nothing else."""
    context = model_config(model).max_position_embeddings
    return EngineConfig.from_knobs(model, quantization=quantization, block_size=BLOCK_SIZE,
                             num_kv_blocks=cdiv(min(context, tokens or context), BLOCK_SIZE) + 1,
                             components=components or Components())



def greedy(make_engine: Callable[[EngineConfig], LLMEngine], config: EngineConfig, prompt: str,
           max_tokens: int) -> tuple[Generation, torch.nn.Module]:
    """The prompt continued greedily by a fresh engine; -> what it wrote, and the model it ran."""
    if not prompt.strip():
        raise ValueError("the prompt is empty: write a few words or a line of code to continue")
    engine = make_engine(config)
    engine.add_request(prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))
    tokens, start = [], time.perf_counter()
    while engine.has_unfinished():
        for chunk in engine.step():
            tokens += chunk.token_ids
    seconds = time.perf_counter() - start
    pieces = [engine.tokenizer.decode([t], skip_special_tokens=False) for t in tokens]
    return Generation(tokens, pieces, seconds), engine.model


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where the two token lists differ; None when they are the same."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))
