"""Reads lm_head.weight unconditionally: a tied checkpoint has none."""
EXERCISE = "1.7"


def transformer_forward(token_ids, weights, cfg):
    x = weights["model.embed_tokens.weight"][token_ids]
    positions = torch.arange(token_ids.shape[0])
    for i in range(cfg.num_hidden_layers):
        prefix = f"model.layers.{i}."
        x = decoder_block(x, positions, {n[len(prefix):]: t for n, t in weights.items() if n.startswith(prefix)}, cfg)
    return F.linear(rms_norm(x, weights["model.norm.weight"], cfg.rms_norm_eps), weights["lm_head.weight"])
