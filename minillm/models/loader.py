"""Read a Hugging Face checkpoint directory: config.json + safetensors (single file or sharded), into the model it
describes (laid out for the kernels and quantized by prepare.py).

Only safetensors are read: a `.bin`/`.pt` checkpoint is a pickle, and unpickling runs arbitrary
code from the file. Every tensor is checked against the model before it is copied, so a wrong
checkpoint fails with the tensor's name and both shapes instead of a matmul error later.
"""
import json
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from minillm.layers.rotary import RotaryEmbedding
from minillm.models.model_config import ModelConfig
from minillm.models.registry import MODEL_CLASSES
from minillm.quant.checkpoint import load_quantized, quant_config_of

# Checkpoint projections that minillm stacks into one fused matrix: name -> (fused name, index).
FUSED = {
    "q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1),
}
# Tensors some checkpoints carry that hold nothing minillm needs (RoPE tables are recomputed).
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def read_checkpoint(model_dir: Path, dtype: torch.dtype, device: torch.device) -> torch.nn.Module:
    """Build the model that config.json describes and fill it from the directory's safetensors."""
    cfg_path = model_dir / "config.json"
    if not cfg_path.is_file():
        raise FileNotFoundError(f"{model_dir} has no config.json: not a Hugging Face model directory")
    cfg = ModelConfig.from_file(cfg_path)
    quantized = quant_config_of(json.loads(cfg_path.read_text()))
    model = build_empty(cfg, device)
    model.to(dtype)
    if quantized is not None:  # a checkpoint minillm quantized and saved (minillm/quant/checkpoint.py)
        load_quantized(model, quantized, model_dir)
    else:
        load_weights(model, checkpoint_files(model_dir), cfg)
    return model.eval()


def build_empty(cfg: ModelConfig, device: torch.device) -> torch.nn.Module:
    """The model of cfg on device, its weights uninitialized: built on the meta device, so that no layer draws
    the random initial weights the checkpoint replaces next (on SmolLM2, 0.9 s of a 1.9 s load), then given
    memory. The loaders fill every parameter or refuse the checkpoint; the rotary tables are computed again.
    No operator runs on a meta tensor, here or in the layers' constructors: torch runs those through its
    Python references, whose first call imports torch._dynamo and sympy (1,400 modules, 1.5-2 s in every
    process that loads a model). Hence torch.empty for each tensor, not Module.to_empty (empty_like)."""
    with torch.device("meta"):
        model = MODEL_CLASSES[cfg.architecture](cfg)
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            setattr(module, name, torch.nn.Parameter(torch.empty(param.shape, dtype=param.dtype, device=device),
                                                     requires_grad=param.requires_grad))
        for name, buffer in module.named_buffers(recurse=False):
            setattr(module, name, torch.empty(buffer.shape, dtype=buffer.dtype, device=device))
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    for module in model.modules():
        if isinstance(module, RotaryEmbedding):
            module.reset_tables()
    return model


def checkpoint_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        missing = [s for s in shards if not (model_dir / s).is_file()]
        if missing:
            raise FileNotFoundError(f"{index} names shards that are not there: {', '.join(missing)}")
        return [model_dir / s for s in shards]
    single = model_dir / "model.safetensors"
    if single.is_file():
        return [single]
    pickles = [p.name for p in model_dir.glob("*.bin")] + [p.name for p in model_dir.glob("*.pt")]
    hint = (f" It has {', '.join(pickles)}: pickle checkpoints are not loaded because unpickling can "
            "run code; convert them to safetensors first.") if pickles else ""
    raise FileNotFoundError(f"{model_dir} has no model.safetensors or model.safetensors.index.json.{hint}")


def _shard_sizes(cfg: ModelConfig, fused: str) -> list[int]:
    if fused == "qkv_proj":
        kv = cfg.num_key_value_heads * cfg.head_dim
        return [cfg.num_attention_heads * cfg.head_dim, kv, kv]
    return [cfg.intermediate_size, cfg.intermediate_size]


def _target(params: dict, cfg: ModelConfig, name: str):
    """The tensor (a parameter, or the slice of a fused one) that checkpoint tensor `name` fills;
    None for a tensor minillm does not use."""
    if name.endswith(IGNORED_SUFFIXES) or (cfg.tie_word_embeddings and name == "lm_head.weight"):
        return None
    parts = name.split(".")
    for i, part in enumerate(parts):
        if part in FUSED:
            fused, idx = FUSED[part]
            pname = ".".join(parts[:i] + [fused] + parts[i + 1:])
            if pname not in params:
                break
            sizes = _shard_sizes(cfg, fused)
            start = sum(sizes[:idx])
            return params[pname][start:start + sizes[idx]]
    if name not in params:
        raise ValueError(f"checkpoint tensor {name!r} has no place in a {cfg.architecture} with this "
                         f"config.json (is the config for another model?)")
    return params[name]


def load_weights(model: torch.nn.Module, files: list[Path], cfg: ModelConfig) -> None:
    params = dict(model.named_parameters())  # tied weights appear once, under the embedding's name
    expected = set(_checkpoint_names(params, cfg))
    seen: set[str] = set()
    with torch.no_grad():
        for path in files:
            try:
                handle = safe_open(str(path), framework="pt", device="cpu")
            except (SafetensorError, OSError) as e:
                raise ValueError(f"cannot read {path}: not a valid safetensors file "
                                 f"(truncated or corrupt?): {e}") from None
            with handle as f:
                for name in f.keys():
                    dest = _target(params, cfg, name)
                    if dest is None:
                        continue
                    try:
                        tensor = f.get_tensor(name)
                    except SafetensorError as e:
                        raise ValueError(f"cannot read tensor {name!r} from {path}: {e}") from None
                    if tuple(tensor.shape) != tuple(dest.shape):
                        raise ValueError(f"tensor {name!r} in {path.name} has shape {tuple(tensor.shape)}, "
                                         f"but the model expects {tuple(dest.shape)}")
                    dest.copy_(tensor)
                    seen.add(name)
    missing = sorted(expected - seen)
    if missing:
        more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
        raise ValueError(f"checkpoint is missing tensors: {', '.join(missing[:5])}{more}")


def _checkpoint_names(params: dict, cfg: ModelConfig):
    """The Hugging Face tensor names that must be present to fill every parameter."""
    unfused = {}
    for part, (fused, idx) in FUSED.items():
        unfused.setdefault(fused, [None] * len(_shard_sizes(cfg, fused)))[idx] = part
    for name in params:
        parts = name.split(".")
        hit = next((i for i, p in enumerate(parts) if p in unfused), None)
        if hit is None:
            yield name
        else:
            for part in unfused[parts[hit]]:
                yield ".".join(parts[:hit] + [part] + parts[hit + 1:])
