"""Takes head_dim as hidden_size // num_attention_heads instead of reading cfg.head_dim."""
EXERCISE = "0.4"


def kv_cache_bytes(cfg, num_tokens, bytes_per_element):
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * num_tokens * bytes_per_element
