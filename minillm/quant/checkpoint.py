"""Save a quantized model as a checkpoint directory, and load it back: safetensors only, never pickle.

The directory looks like a Hugging Face one (config.json, model.safetensors, tokenizer.json), with
two differences: config.json carries `quantization_config` (the QuantConfig, quant_method
"minillm"), and the tensors use minillm's own module names (fused qkv_proj and gate_up_proj), with
each quantized layer's codes, scales and zero points as `<layer>.qweight`, `.scale`, `.zero`.
"""
import json
import shutil
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from minillm.quant.apply import quantize_model
from minillm.quant.quant_config import QuantConfig

COPIED = ("tokenizer.json", "generation_config.json")


def save_quantized(model: torch.nn.Module, source_dir: Path, out_dir: Path) -> Path:
    """Write model (quantized by quantize_model) to out_dir, with source_dir's config and tokenizer."""
    config = getattr(model, "quant_config", None)
    if config is None:
        raise ValueError("this model is not quantized: call minillm.quant.quantize_model first")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    raw = json.loads((Path(source_dir) / "config.json").read_text())
    raw["quantization_config"] = config.to_dict()
    (out_dir / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
    for name in COPIED:
        if (Path(source_dir) / name).is_file():
            shutil.copyfile(Path(source_dir) / name, out_dir / name)
    save_file(_tensors(model), str(out_dir / "model.safetensors"), metadata={"format": "pt", "quantized_by": "minillm"})
    return out_dir


def _tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's persistent state, each tensor contiguous and stored once (a tied LM head is the
    embedding: it is written under the embedding's name only)."""
    seen, out = set(), {}
    for name, tensor in model.state_dict().items():
        key = (tensor.data_ptr(), tuple(tensor.shape))
        if key in seen:
            continue
        seen.add(key)
        out[name] = tensor.detach().contiguous()
    return out


def quant_config_of(raw_config: dict) -> QuantConfig | None:
    """The QuantConfig a checkpoint's config.json records, or None for a full-precision one."""
    raw = raw_config.get("quantization_config")
    return None if raw is None else QuantConfig.from_dict(raw)


def load_quantized(model: torch.nn.Module, config: QuantConfig, model_dir: Path) -> torch.nn.Module:
    """Fill model (just built, full precision) from a quantized checkpoint directory: its layers are
    first given the quantized form config describes, then every tensor is loaded by name."""
    quantize_model(model, config, empty=True)
    path = Path(model_dir) / "model.safetensors"
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError) as e:
        raise ValueError(f"cannot read {path}: not a valid safetensors file: {e}") from None
    state = model.state_dict()
    missing = sorted(n for n in state if n not in tensors and not _tied_copy(model, n))
    unexpected = sorted(n for n in tensors if n not in state)
    if missing or unexpected:
        raise ValueError(f"{path} does not match its quantization_config ({config.label()}): "
                         f"missing {missing[:5]}, unexpected {unexpected[:5]}")
    with torch.no_grad():
        for name, tensor in tensors.items():
            if tuple(tensor.shape) != tuple(state[name].shape) or tensor.dtype != state[name].dtype:
                raise ValueError(f"tensor {name!r} in {path.name} is {tensor.dtype} {tuple(tensor.shape)}, but the "
                                 f"model expects {state[name].dtype} {tuple(state[name].shape)}")
            state[name].copy_(tensor)
    return model


def _tied_copy(model: torch.nn.Module, name: str) -> bool:
    head = getattr(model.lm_head, "weight", None)
    return name == "lm_head.weight" and head is model.model.embed_tokens.weight
