"""Will a configuration fit in a memory budget? Weights + KV pool + activations, from the model's shapes.

    weights      the linear layers at the scheme's bytes per weight (with its scales), the embedding
                 (and an untied LM head) at the dtype's bytes
    KV pool      blocks x block_size x 2 (K and V) x layers x kv heads x head_dim x the dtype's bytes
    activations  one step's: the batched tokens' hidden states and MLP rows, and each sequence's logits

A pure function of the shapes (ModelConfig's fields), so it answers before any weight is loaded; the
measured peak RSS of a real run checks it (measurement.py).
"""
from minillm.models.model_config import ModelConfig
from minillm.perf.roofline import param_count


def bytes_per_weight(scheme: str, dtype_bytes: int = 4, group_size: int = 64, in_features: int = 576) -> float:
    """A linear layer's bytes per weight under a scheme: none at the dtype's bytes; int8 and fp8 a byte and
    one float32 scale per row of in_features; int4 half a byte and a float32 scale and zero point per group."""
    if scheme == "none":
        return float(dtype_bytes)
    if scheme in ("int8", "fp8"):
        return 1 + 4 / in_features
    if scheme == "int4":
        return 0.5 + 8 / group_size
    raise ValueError(f"unknown quantization scheme {scheme!r}: the schemes are none, int8, int4, fp8")


def weight_bytes(shape: ModelConfig, scheme: str = "none", dtype_bytes: int = 4) -> int:
    """The weights' bytes: the decoder layers' projections quantized by the scheme, the embedding and the LM
    head (quantized schemes leave it at the dtype, as QuantConfig's default projections do) at dtype_bytes."""
    head = shape.hidden_size * shape.vocab_size
    layers = param_count(shape) - head
    embedding = 0 if shape.tie_word_embeddings else head  # a tied head is the embedding itself
    return round(layers * bytes_per_weight(scheme, dtype_bytes, in_features=shape.hidden_size)
                 + (head + embedding) * dtype_bytes)


def kv_bytes(shape: ModelConfig, blocks: int, block_size: int, dtype_bytes: int = 4) -> int:
    """The KV pool's bytes: every slot of every block holds a token's K and V in every layer."""
    return blocks * block_size * shape.kv_bytes_per_token(dtype_bytes)


def activation_bytes(shape: ModelConfig, batched_tokens: int, seqs: int, dtype_bytes: int = 4) -> int:
    """One step's largest live tensors: per batched token its hidden state, q/k/v and MLP rows (gate, up),
    per sequence its float32 logits."""
    per_token = 4 * shape.hidden_size + 2 * shape.intermediate_size
    return batched_tokens * per_token * dtype_bytes + seqs * shape.vocab_size * 4


def memory_needed(shape: ModelConfig, knobs: dict, dtype_bytes: int = 4) -> dict[str, int]:
    """{"weights", "kv", "activations", "total"} in bytes of a configuration (space.py's knobs)."""
    parts = {"weights": weight_bytes(shape, knobs.get("quantization", "none"), dtype_bytes),
             "kv": kv_bytes(shape, knobs["num_kv_blocks"], knobs["block_size"], dtype_bytes),
             "activations": activation_bytes(shape, knobs["max_num_batched_tokens"], knobs["max_num_seqs"],
                                             dtype_bytes)}
    return {**parts, "total": sum(parts.values())}


def fits(shape: ModelConfig, knobs: dict, budget_bytes: int, dtype_bytes: int = 4) -> tuple[bool, int]:
    """Whether the configuration fits the budget, and by how many bytes it misses (<= 0: it fits, with
    that much to spare); exactly at the budget fits."""
    miss = memory_needed(shape, knobs, dtype_bytes)["total"] - budget_bytes
    return miss <= 0, miss
