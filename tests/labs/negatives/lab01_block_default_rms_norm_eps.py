"""Normalises with the default epsilon 1e-6 instead of cfg.rms_norm_eps."""
EXERCISE = "1.6"
_solution = decoder_block


def decoder_block(x, positions, w, cfg):
    import dataclasses
    return _solution(x, positions, w, dataclasses.replace(cfg, rms_norm_eps=1e-6))
