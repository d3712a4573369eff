"""Sizes the KV cache with the query heads, ignoring grouped-query attention."""
EXERCISE = "0.4"


def kv_cache_bytes(cfg, num_tokens, bytes_per_element):
    return 2 * cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim * num_tokens * bytes_per_element
