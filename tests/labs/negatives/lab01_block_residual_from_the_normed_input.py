"""Adds the attention output to the normalised input instead of the residual stream x."""
EXERCISE = "1.6"


def decoder_block(x, positions, w, cfg):
    n, d = x.shape[0], cfg.head_dim
    a = rms_norm(x, w["input_layernorm.weight"], cfg.rms_norm_eps)
    q = F.linear(a, w["self_attn.q_proj.weight"]).view(n, cfg.num_attention_heads, d)
    k = F.linear(a, w["self_attn.k_proj.weight"]).view(n, cfg.num_key_value_heads, d)
    v = F.linear(a, w["self_attn.v_proj.weight"]).view(n, cfg.num_key_value_heads, d)
    cos, sin = rope_cos_sin(positions, d, cfg.rope_theta)
    attn = causal_gqa_attention(apply_rope(q, cos, sin), apply_rope(k, cos, sin), v)
    h = a + F.linear(attn.reshape(n, -1), w["self_attn.o_proj.weight"])
    m = rms_norm(h, w["post_attention_layernorm.weight"], cfg.rms_norm_eps)
    return h + swiglu(m, w["mlp.gate_proj.weight"], w["mlp.up_proj.weight"], w["mlp.down_proj.weight"])
