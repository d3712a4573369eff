"""Write a minillm model back out as a Hugging Face checkpoint (config.json + model.safetensors).

The inverse of the loader: fused qkv / gate_up matrices are split into the checkpoint's separate
q/k/v and gate/up tensors, so `transformers` and every other tool can read what minillm trains.
"""
import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from minillm.models.loader import FUSED, _shard_sizes
from minillm.models.model_config import ModelConfig


def hf_state_dict(model: torch.nn.Module, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    out = {}
    parts_of = {}
    for part, (fused, idx) in FUSED.items():
        parts_of.setdefault(fused, {})[idx] = part
    for name, tensor in model.state_dict().items():
        if cfg.tie_word_embeddings and name == "lm_head.weight":
            continue
        fused = next((f for f in parts_of if f"{f}." in name), None)
        if fused is None:
            out[name] = tensor.contiguous()
            continue
        for idx, piece in enumerate(tensor.split(_shard_sizes(cfg, fused), dim=0)):
            out[name.replace(fused, parts_of[fused][idx])] = piece.contiguous()
    return out


def save_checkpoint(model: torch.nn.Module, cfg: ModelConfig, hf_config: dict, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
    tensors = {k: v.detach().float().cpu() for k, v in hf_state_dict(model, cfg).items()}
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
