"""Aligns the causal mask top-left (query i sees keys 0..i): off by kv_len - q_len under a cache."""
EXERCISE = "1.4"


def causal_gqa_attention(q, k, v):
    q_len, heads, head_dim = q.shape
    kv_len, kv_heads, _ = k.shape
    k, v = k.repeat_interleave(heads // kv_heads, 1), v.repeat_interleave(heads // kv_heads, 1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(head_dim)
    allowed = torch.ones(q_len, kv_len, dtype=torch.bool).tril()
    return torch.einsum("hqk,khd->qhd", scores.masked_fill(~allowed, float("-inf")).softmax(-1), v)
