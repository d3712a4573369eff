"""Draws by the Gumbel-max trick, argmax(z + Gumbel noise) from the generator: the right distribution,
but not the draw the exercise fixes, so not the engine's tokens for the same seed."""
EXERCISE = "2.5"


def sample(logits, temperature, top_k, top_p, generator):
    if temperature == 0:
        return logits.argmax(-1)
    z = top_p_filter(top_k_filter(logits / temperature, top_k), top_p)
    u = torch.rand(z.shape, generator=generator).clamp_min(1e-20)
    return (z - (-u.log()).log()).argmax(-1)
