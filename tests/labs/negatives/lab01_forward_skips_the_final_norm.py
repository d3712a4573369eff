"""Projects the last layer's output onto the vocabulary without the final RMSNorm."""
EXERCISE = "1.7"


def transformer_forward(token_ids, weights, cfg):
    x = weights["model.embed_tokens.weight"][token_ids]
    positions = torch.arange(token_ids.shape[0])
    for i in range(cfg.num_hidden_layers):
        prefix = f"model.layers.{i}."
        x = decoder_block(x, positions, {n[len(prefix):]: t for n, t in weights.items() if n.startswith(prefix)}, cfg)
    return F.linear(x, weights.get("lm_head.weight", weights["model.embed_tokens.weight"]))
