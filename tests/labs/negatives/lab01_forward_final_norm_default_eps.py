"""The final RMSNorm uses the default epsilon 1e-6 instead of cfg.rms_norm_eps (the blocks use cfg's)."""
EXERCISE = "1.7"


def transformer_forward(token_ids, weights, cfg):
    x = weights["model.embed_tokens.weight"][token_ids]
    positions = torch.arange(token_ids.shape[0])
    for i in range(cfg.num_hidden_layers):
        prefix = f"model.layers.{i}."
        x = decoder_block(x, positions, {n[len(prefix):]: t for n, t in weights.items() if n.startswith(prefix)}, cfg)
    x = rms_norm(x, weights["model.norm.weight"], 1e-6)
    return F.linear(x, weights.get("lm_head.weight", weights["model.embed_tokens.weight"]))
