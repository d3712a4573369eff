"""Reads the first context_len slots of the pool, ignoring the block table."""
EXERCISE = "3.3"


def paged_attention(q, k_cache, v_cache, block_table, context_len, block_size):
    return causal_attention(q, k_cache[:context_len], v_cache[:context_len])
