"""Model shapes for the roofline: the bundled models (read from their config.json) and a few
public checkpoints (figures copied from their published config.json), no weights needed."""
from minillm.models.model_config import ModelConfig
from minillm.models.registry import bundled_models, resolve_model_path


def _public(vocab, hidden, inter, layers, heads, kv_heads, head_dim, max_pos, tied, theta) -> ModelConfig:
    return ModelConfig("LlamaForCausalLM", vocab, hidden, inter, layers, heads, kv_heads, head_dim,
                       max_pos, rope_theta=theta, tie_word_embeddings=tied)


MODEL_SHAPES: dict[str, ModelConfig] = {
    "SmolLM2-135M": _public(49152, 576, 1536, 30, 9, 3, 64, 8192, True, 100000.0),
    "Qwen2.5-0.5B": _public(151936, 896, 4864, 24, 14, 2, 64, 32768, True, 1000000.0),
    "Llama-3.1-8B": _public(128256, 4096, 14336, 32, 32, 8, 128, 131072, False, 500000.0),
    "Llama-3.1-70B": _public(128256, 8192, 28672, 80, 64, 8, 128, 131072, False, 500000.0),
}


def hf_config_fields(cfg: ModelConfig) -> dict:
    """The Hugging Face config.json fields of a shape (for building a random checkpoint of it)."""
    return dict(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
                num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=cfg.num_attention_heads,
                num_key_value_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim,
                max_position_embeddings=cfg.max_position_embeddings, rope_theta=cfg.rope_theta,
                tie_word_embeddings=cfg.tie_word_embeddings)


def model_shape(name: str) -> ModelConfig:
    """A bundled model's config (by name or directory) or one of MODEL_SHAPES."""
    if name in MODEL_SHAPES:
        return MODEL_SHAPES[name]
    return ModelConfig.from_file(resolve_model_path(name) / "config.json")


def shape_names() -> list[str]:
    return bundled_models() + list(MODEL_SHAPES)
