"""ModelConfig: the architecture hyper-parameters minillm reads from a Hugging Face config.json."""
import json
from dataclasses import dataclass
from pathlib import Path

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM")


def eos_token_ids(value) -> tuple[int, ...]:
    """A config's `eos_token_id` (one id, a list of ids, or absent) as a tuple of ids."""
    if value is None:
        return ()
    return tuple(value) if isinstance(value, list) else (value,)


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    qkv_bias: bool = False
    tie_word_embeddings: bool = False
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None

    def kv_bytes_per_token(self, bytes_per_element: int) -> int:
        """Bytes of K and V for one token across all layers."""
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim * bytes_per_element

    @classmethod
    def from_dict(cls, raw: dict) -> "ModelConfig":
        archs = raw.get("architectures") or []
        arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if arch is None:
            raise ValueError(f"unsupported architecture {archs or '(none given)'}: minillm supports "
                             f"{', '.join(SUPPORTED_ARCHITECTURES)}")
        _check_features(arch, raw)
        heads = raw["num_attention_heads"]
        return cls(
            architecture=arch,
            vocab_size=raw["vocab_size"],
            hidden_size=raw["hidden_size"],
            intermediate_size=raw["intermediate_size"],
            num_hidden_layers=raw["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=raw.get("num_key_value_heads") or heads,
            head_dim=raw.get("head_dim") or raw["hidden_size"] // heads,
            max_position_embeddings=raw.get("max_position_embeddings", 2048),
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            rope_theta=_rope_theta(raw),
            # Qwen2 always has q/k/v biases; Llama has them when attention_bias is set.
            qkv_bias=arch == "Qwen2ForCausalLM" or bool(raw.get("attention_bias", False)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            eos_token_ids=eos_token_ids(raw.get("eos_token_id")),
            bos_token_id=raw.get("bos_token_id"),
        )

    @classmethod
    def from_file(cls, path: str | Path) -> "ModelConfig":
        try:
            raw = json.loads(Path(path).read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not valid JSON: {e}") from None
        try:
            return cls.from_dict(raw)
        except KeyError as e:
            raise ValueError(f"{path} lacks the required field {e.args[0]!r}") from None


def _rope_theta(raw: dict) -> float:
    # transformers 5 moved rope_theta into a rope_parameters dict; older configs keep it at the top.
    params = raw.get("rope_parameters") or {}
    return float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))


def _check_features(arch: str, raw: dict) -> None:
    """Refuse, by name, the features this engine does not implement rather than compute wrongly."""
    scaling = raw.get("rope_scaling") or {}
    kind = scaling.get("rope_type", scaling.get("type")) if scaling else None
    if kind is None:
        kind = (raw.get("rope_parameters") or {}).get("rope_type")
    if kind not in (None, "default"):
        raise ValueError(f"rope scaling {kind!r} is not supported (only plain RoPE is)")
    window = raw.get("sliding_window")
    uses_window = raw.get("use_sliding_window", arch == "MistralForCausalLM")
    if uses_window and window is not None and window < raw.get("max_position_embeddings", 0):
        raise ValueError(f"sliding-window attention (window {window}) is not supported")
    if raw.get("hidden_act", "silu") != "silu":
        raise ValueError(f"activation {raw['hidden_act']!r} is not supported (only silu)")
