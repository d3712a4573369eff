"""Builds the rotary tables with the common default theta 10000 instead of cfg.rope_theta."""
EXERCISE = "1.6"
_solution = decoder_block


def decoder_block(x, positions, w, cfg):
    import dataclasses
    return _solution(x, positions, w, dataclasses.replace(cfg, rope_theta=10000.0))
