"""Proposer weights fitted to one target (the heads of heads.py, the MLP speculator of mlp_speculator.py): the
fingerprint that names the target, and the loading that checks it. Proposals from weights fitted to another model
would be verified all the same, but rejected nearly always: a slower decode, no error. So a mismatch is one."""
import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn


def fingerprint(model: nn.Module) -> str:
    """What proposer weights are fitted to: the target's shape and a digest of its LM head's weights, taken in
    bfloat16 so that the same checkpoint loaded in float32 or bfloat16, on any device, digests alike
    (a float sum would not: its rounding depends on the order of the additions)."""
    cfg = model.config
    bits = model.lm_head.weight.detach().to("cpu", torch.bfloat16).contiguous().view(torch.int16)
    digest = hashlib.sha256(bits.numpy().tobytes()).hexdigest()[:16]
    return json.dumps([cfg.hidden_size, cfg.vocab_size, cfg.num_hidden_layers, digest])


def load_fitted(path: Path, target: nn.Module, build: Callable[[dict[str, str]], nn.Module], what: str,
                command: str) -> nn.Module:
    """The module build(the file's metadata) makes, filled from the safetensors file `path` once its fingerprint is
    the target's, on the device and in the dtype of the target's LM head. what: the module, for the errors;
    command: the `python -m minillm train` command that fits one."""
    if not path.is_file():
        raise FileNotFoundError(f"no {what} at {path}: `python -m minillm train {command}` trains a target's")
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    if meta.get("target") != fingerprint(target):
        raise ValueError(f"{path} holds {what} trained for another model (fingerprint {meta.get('target')}, this "
                         f"target's {fingerprint(target)}): `python -m minillm train {command}` trains this one's")
    module = build(meta)
    module.load_state_dict(tensors)  # copies into the module's float32 parameters, whatever dtype the file holds
    weight = target.lm_head.weight
    return module.to(device=weight.device, dtype=weight.dtype).eval()
