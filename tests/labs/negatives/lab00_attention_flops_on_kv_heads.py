"""Counts attention FLOPs over kv heads instead of query heads."""
EXERCISE = "0.3"


def attention_cost(q_len, kv_len, heads, kv_heads, head_dim, bytes_per_element):
    flops = 4 * q_len * kv_len * kv_heads * head_dim
    return flops, (2 * q_len * heads * head_dim + 2 * kv_len * kv_heads * head_dim) * bytes_per_element
