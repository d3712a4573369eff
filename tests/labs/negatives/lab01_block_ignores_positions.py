"""Rotates by 0..n-1 whatever positions it is given."""
EXERCISE = "1.6"
_solution = decoder_block


def decoder_block(x, positions, w, cfg):
    return _solution(x, torch.arange(x.shape[0]), w, cfg)
