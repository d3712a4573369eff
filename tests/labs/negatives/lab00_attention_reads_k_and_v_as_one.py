"""Counts the keys and values as one read of kv_len x kv_heads x head_dim elements, not two."""
EXERCISE = "0.3"


def attention_cost(q_len, kv_len, heads, kv_heads, head_dim, bytes_per_element):
    flops = 4 * q_len * kv_len * heads * head_dim
    return flops, (2 * q_len * heads * head_dim + kv_len * kv_heads * head_dim) * bytes_per_element
