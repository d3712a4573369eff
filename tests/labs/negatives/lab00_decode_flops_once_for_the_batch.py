"""Counts the weight FLOPs once per step, as if the batch shared them the way it shares the weight reads."""
EXERCISE = "0.5"


def decode_step_cost(cfg, context_len, batch_size, bytes_per_element):
    h, d = cfg.hidden_size, cfg.head_dim
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    per_layer = h * (heads + 2 * kv_heads) * d + heads * d * h + 3 * h * cfg.intermediate_size + 2 * h
    params = cfg.num_hidden_layers * per_layer + h + cfg.vocab_size * h
    attn_flops, _ = attention_cost(1, context_len, heads, kv_heads, d, bytes_per_element)
    flops = 2 * params + cfg.num_hidden_layers * batch_size * attn_flops
    return flops, params * bytes_per_element + kv_cache_bytes(cfg, batch_size * context_len, bytes_per_element)
