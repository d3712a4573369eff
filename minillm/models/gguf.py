"""Load a GGUF file (llama.cpp's format) by converting it, once, into a Hugging Face model folder.

    model.gguf --gguf.GGUFReader--> metadata + tensors (F32/F16/BF16, Q8_0/Q4_0/Q4_1 blocks)
      --> config.json                from the metadata (layers, width, heads, rope theta, ...)
      --> model.safetensors          every tensor dequantized to float32, renamed, Q/K rows un-permuted
      --> tokenizer.json, tokenizer_config.json, generation_config.json   (gguf_tokenizer.py)

The folder sits in a cache (MINILLM_CACHE, default ~/.cache/minillm) under a key made of the file's
bytes (SHA-256, ~60 ms for a 100 MB file) and of FORMAT_VERSION, so a changed file or converter converts
anew, and copies of one file (one per virtual environment, say) share one folder. Everything else then
reads it as any checkpoint (loader.py, tokenizer.py, chat_template.py, and transformers too), and a later
load costs what loading any float32 checkpoint costs.

Why un-permute: llama.cpp's converter reorders the rows of each head of q_proj and k_proj for
ggml's RoPE, which rotates neighbouring pairs (x0, x1), (x2, x3), ...; Hugging Face's Llama rotates
the two halves of a head, (x0, x32), (x1, x33), ... (rotate_half). Qwen2 files are not reordered:
llama.cpp runs them with the halves ("NeoX") RoPE.
"""
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import torch
from gguf import GGUFReader
from safetensors.torch import save_file
from tqdm.auto import tqdm

from minillm.models.gguf_quants import dequantize
from minillm.models.gguf_tokenizer import build_tokenizer, tokenizer_config

FORMAT_VERSION = 1  # bump when the folder written here changes: cached conversions are then redone
# general.architecture (also the config's model_type) -> (Hugging Face class, whether llama.cpp's
# converter reordered the Q/K rows)
ARCHITECTURES = {"llama": ("LlamaForCausalLM", True), "qwen2": ("Qwen2ForCausalLM", False)}
GLOBAL_TENSORS = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
LAYER_TENSORS = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
TENSOR_NAME = re.compile(r"(?:blk\.(\d+)\.)?(\w+)\.(weight|bias)")


def cache_root() -> Path:
    return Path(os.environ.get("MINILLM_CACHE") or Path.home() / ".cache" / "minillm").expanduser()


def read_gguf(path: Path) -> tuple[GGUFReader, dict]:
    """-> (the reader, its metadata as key -> value). A file that is not GGUF, or is cut short, raises ValueError."""
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ValueError(f"{path} is not a GGUF file: it starts with {magic!r}, not b'GGUF'")
    try:
        reader = GGUFReader(path)
    except (ValueError, IndexError, OSError) as e:  # numpy reshape/index errors when the data runs out
        raise ValueError(f"cannot read {path} ({path.stat().st_size:,} bytes) as GGUF: the file is truncated or "
                         f"corrupt ({e}); download or copy it again") from None
    return reader, {name: field.contents() for name, field in reader.fields.items()}


def _require(meta: dict, key: str):
    if key not in meta:
        raise ValueError(f"the GGUF file lacks {key!r}, which minillm needs to build the model")
    return meta[key]


def hf_config(meta: dict, tensor_names: set[str]) -> dict:
    """The file's metadata as a Hugging Face config.json (Llama-family decoders only)."""
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise ValueError(f"general.architecture = {arch!r} is not supported: minillm loads Llama-family GGUF files "
                         f"({', '.join(ARCHITECTURES)}; Mistral and SmolLM files say 'llama')")
    experts = meta.get(f"{arch}.expert_count", 0)
    if experts:
        raise ValueError(f"{arch}.expert_count = {experts}: mixture-of-experts models are not supported")
    scaling = meta.get(f"{arch}.rope.scaling.type", "none")
    if scaling != "none" or "rope_freqs.weight" in tensor_names:
        raise ValueError(f"RoPE scaling ({scaling if scaling != 'none' else 'rope_freqs.weight'}) is not supported "
                         f"(only plain RoPE is)")
    hidden, heads = _require(meta, f"{arch}.embedding_length"), _require(meta, f"{arch}.attention.head_count")
    head_dim = meta.get(f"{arch}.attention.key_length", hidden // heads)
    rotary = meta.get(f"{arch}.rope.dimension_count", head_dim)
    if rotary != head_dim:
        raise ValueError(f"{arch}.rope.dimension_count = {rotary} but heads are {head_dim} wide: "
                         f"partial rotary embeddings are not supported")
    return {
        "architectures": [ARCHITECTURES[arch][0]], "model_type": arch,
        "vocab_size": meta.get(f"{arch}.vocab_size", len(_require(meta, "tokenizer.ggml.tokens"))),
        "hidden_size": hidden,
        "intermediate_size": _require(meta, f"{arch}.feed_forward_length"),
        "num_hidden_layers": _require(meta, f"{arch}.block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": meta.get(f"{arch}.attention.head_count_kv", heads),
        "head_dim": head_dim,
        "max_position_embeddings": _require(meta, f"{arch}.context_length"),
        "rms_norm_eps": _require(meta, f"{arch}.attention.layer_norm_rms_epsilon"),
        "rope_theta": meta.get(f"{arch}.rope.freq_base", 10000.0),
        "hidden_act": "silu",
        "attention_bias": "blk.0.attn_q.bias" in tensor_names,
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
        "torch_dtype": "float32",
    }


def unpermute_rope_rows(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Undo llama.cpp's reordering of a q_proj / k_proj weight [n_head * head_dim, ...] (or bias):
    within each head, its converter puts rows (0, half, 1, half + 1, ...) where Hugging Face has
    (0, 1, ..., half - 1, half, ...)."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def hf_name(name: str) -> str:
    """A GGUF tensor name (blk.3.attn_q.weight) -> its Hugging Face name (model.layers.3.self_attn.q_proj.weight)."""
    match = TENSOR_NAME.fullmatch(name)
    layer, part, kind = match.groups() if match else (None, None, None)
    if match and layer is None and part in GLOBAL_TENSORS:
        return f"{GLOBAL_TENSORS[part]}.{kind}"
    if match and layer is not None and part in LAYER_TENSORS:
        return f"model.layers.{layer}.{LAYER_TENSORS[part]}.{kind}"
    raise ValueError(f"tensor {name!r} has no place in a Llama-family decoder (minillm reads "
                     f"{', '.join(GLOBAL_TENSORS)} and blk.N.{{{', '.join(LAYER_TENSORS)}}})")


def hf_tensors(reader: GGUFReader, config: dict) -> dict[str, torch.Tensor]:
    """Every tensor of the file, dequantized to float32 and under its Hugging Face name."""
    reordered = ARCHITECTURES[config["model_type"]][1]
    heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
    out = {}
    for t in tqdm(reader.tensors, desc="Converting GGUF", unit="tensor", file=sys.stderr):  # TQDM_DISABLE=1 hides it
        name = hf_name(t.name)
        tensor = dequantize(t.name, t.data, t.tensor_type)  # [out, in] (or [n] for norms and biases)
        part = t.name.split(".")[-2]
        if reordered and part in heads:
            tensor = unpermute_rope_rows(tensor, heads[part])
        out[name] = tensor.contiguous()
    return out


def convert(path: Path, out_dir: Path) -> None:
    """Write the Hugging Face folder for the GGUF file at `path` into out_dir (which must exist)."""
    reader, meta = read_gguf(path)
    tensors = {t.name for t in reader.tensors}
    config = hf_config(meta, tensors)
    tokenizer = build_tokenizer(meta)  # before the weights: a tokenizer it cannot build fails fast
    if "token_embd.weight" not in tensors:
        raise ValueError(f"{path} has no token_embd.weight: not a language model's GGUF file")
    weights = hf_tensors(reader, config)
    vocab = weights["model.embed_tokens.weight"].shape[0]
    if vocab != config["vocab_size"]:
        raise ValueError(f"{path}: the embedding has {vocab} rows but the vocabulary has {config['vocab_size']} tokens")
    save_file(weights, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    generation = {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}
    (out_dir / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    tokenizer.save(str(out_dir / "tokenizer.json"))
    tok_config = tokenizer_config(meta, config["max_position_embeddings"])
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2, ensure_ascii=False) + "\n")


def cache_key(path: Path) -> str:
    """Changes when the file's bytes or the converter (FORMAT_VERSION) do, and only then: not with the file's path
    or modification time, which differ between installs of one package (a key on them left a 540 MB folder per
    virtual environment that ever loaded the real model)."""
    digest = hashlib.sha256(f"minillm-gguf-{FORMAT_VERSION}\n".encode())
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()[:16]


def gguf_model_dir(path: str | Path) -> Path:
    """The converted folder of a GGUF file: from the cache, or converted now (and the path printed to stderr).
    The folder is written under a temporary name and renamed when complete, so an interrupted
    conversion never leaves a folder that a later load would take for a model."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"no GGUF file at {str(path)!r}")
    key = cache_key(path)
    final = cache_root() / "gguf" / f"{path.stem}-{key}"
    for done in [final, *sorted(final.parent.glob(f"[!.]*-{key}"))]:  # the same bytes under another file name
        if (done / "config.json").is_file():
            return done
    final.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        convert(path, partial)
        os.rename(partial, final)
    except OSError:
        if not (final / "config.json").is_file():  # not a concurrent conversion that finished first
            raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    print(f"minillm: converted {path} -> {final}", file=sys.stderr)
    return final
