"""Always uses the embedding matrix as the LM head, even when the checkpoint has its own."""
EXERCISE = "1.7"
_solution = transformer_forward


def transformer_forward(token_ids, weights, cfg):
    return _solution(token_ids, {k: t for k, t in weights.items() if k != "lm_head.weight"}, cfg)
