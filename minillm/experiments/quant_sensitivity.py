"""Which layers and projections are sensitive to quantization, and what happens as more are quantized.

Each measurement quantizes a fresh copy of the full-precision model under a QuantConfig that picks
some layers and projections, and compares it with the full model on the same held-out windows
(eval.Reference). Quantizing one unit alone gives its sensitivity; `orders` ranks the layers by it,
the orders in which cancellation.py quantizes growing sets to see whether errors only add up.
"""
import random
from dataclasses import replace

import torch

from minillm.experiments.quant_quality import Quality, Reference
from minillm.quant.apply import copy_sharing_weights, quantize_model
from minillm.quant.quant_config import LAYER_PROJECTIONS, QuantConfig


def quantized_copy(model: torch.nn.Module, config: QuantConfig) -> torch.nn.Module:
    """A quantized copy of model; model itself stays full precision."""
    if config.calibration is not None:
        raise ValueError(f"sensitivity sweeps quantize without calibration; got calibration={config.calibration!r} "
                         f"(an engine applies it: LLM(model, quantization=config))")
    return quantize_model(copy_sharing_weights(model), config)


def measure(model: torch.nn.Module, reference: Reference, config: QuantConfig) -> Quality:
    return reference.compare(quantized_copy(model, config))


def layer_sensitivity(model: torch.nn.Module, reference: Reference, base: QuantConfig) -> list[Quality]:
    """Quantize each decoder layer alone (base's scheme and projections): one Quality per layer."""
    return [measure(model, reference, replace(base, layers=(i,))) for i in range(len(model.model.layers))]


def sensitivity_grid(model: torch.nn.Module, reference: Reference, base: QuantConfig,
                     projections: tuple[str, ...] = LAYER_PROJECTIONS) -> dict[tuple[int, str], Quality]:
    """Quantize each (layer, projection) alone: the heatmap's cells."""
    return {(i, p): measure(model, reference, replace(base, layers=(i,), projections=(p,)))
            for i in range(len(model.model.layers)) for p in projections}


def orders(sensitivity: list[float], random_seeds: tuple[int, ...] = (0, 1, 2)) -> dict[str, list[int]]:
    """Orders in which to add layers: most sensitive first, least sensitive first, and seeded random
    ones. sensitivity: one error figure per layer (higher = more sensitive); ties keep layer order."""
    layers = list(range(len(sensitivity)))
    out = {"most sensitive first": sorted(layers, key=lambda i: -sensitivity[i]),
           "least sensitive first": sorted(layers, key=lambda i: sensitivity[i])}
    for seed in random_seeds:
        shuffled = layers[:]
        random.Random(seed).shuffle(shuffled)
        out[f"random (seed {seed})"] = shuffled
    return out
