"""Counts the keys but not the values."""
EXERCISE = "0.4"


def kv_cache_bytes(cfg, num_tokens, bytes_per_element):
    return cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * num_tokens * bytes_per_element
