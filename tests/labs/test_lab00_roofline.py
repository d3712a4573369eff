"""Grader of lab 00, the roofline and the memory wall.

Oracles: the formulas (2 FLOPs per multiply-add, bytes = elements x bytes per element, time =
max(F / P, B / W)), written out here and not taken from minillm.perf; minillm's model for how many
weights a decoder holds, and its KV cache for how many bytes one allocates. Every exercise is
checked on fixed cases and on seeded random ones, with shapes where two sizes cannot be confused,
bytes per element drawn from 1, 2, 4 and 8 (never one fixed width), and the degenerate cases the
formulas admit: a matrix-vector product, one token, a copy that does no FLOPs.
"""
import random
from functools import cache

import torch

from minillm.cache.contiguous import ContiguousKVCache
from minillm.labkit import exercise
from minillm.models.llama import LlamaForCausalLM
from minillm.models.model_config import ModelConfig

EXERCISES = {"0.1": "matmul_cost", "0.2": "roofline_time", "0.3": "attention_cost", "0.4": "kv_cache_bytes",
             "0.5": "decode_step_cost", "0.6": "decode_tokens_per_s"}
H100 = {"peak_flops": 989e12, "bandwidth": 3.35e12}
DTYPES = {1: torch.int8, 2: torch.bfloat16, 4: torch.float32, 8: torch.float64}
WIDTHS = tuple(DTYPES)  # bytes per element


def close(a, b, rel=1e-9) -> bool:
    return abs(a - b) <= rel * abs(b)


def config(tied: bool) -> ModelConfig:
    """A GQA decoder (6 query heads on 2 kv heads) whose head_dim (24) is not hidden / heads (16)."""
    return ModelConfig(architecture="LlamaForCausalLM", vocab_size=500, hidden_size=96, intermediate_size=160,
                       num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=2, head_dim=24,
                       max_position_embeddings=256, tie_word_embeddings=tied)


def random_configs(seed: int, count: int) -> list[ModelConfig]:
    """Small GQA decoders of random shape, alternately tied and untied, head_dim never hidden / heads."""
    rng, configs = random.Random(seed), []
    while len(configs) < count:
        kv_heads = rng.choice((1, 2, 3))
        heads = kv_heads * rng.choice((2, 3, 4))
        head_dim, hidden = rng.choice((8, 12, 20, 28)), rng.choice((40, 56, 72, 88))
        if hidden // heads == head_dim:
            continue
        configs.append(ModelConfig(
            architecture="LlamaForCausalLM", vocab_size=rng.randrange(100, 700), hidden_size=hidden,
            intermediate_size=rng.randrange(50, 200), num_hidden_layers=rng.randint(2, 5), num_attention_heads=heads,
            num_key_value_heads=kv_heads, head_dim=head_dim, max_position_embeddings=256,
            tie_word_embeddings=len(configs) % 2 == 0))
    return configs


def shape(cfg: ModelConfig) -> str:
    return (f"layers={cfg.num_hidden_layers}, hidden={cfg.hidden_size}, heads={cfg.num_attention_heads}, "
            f"kv_heads={cfg.num_key_value_heads}, head_dim={cfg.head_dim}, tied={cfg.tie_word_embeddings}")


def matmul_cases() -> list[tuple[int, int, int, int]]:
    rng = random.Random(1)
    drawn = [(rng.randint(1, 3000), rng.randint(1, 3000), rng.randint(1, 3000), rng.choice(WIDTHS))
             for _ in range(20)]
    return [(1, 4096, 4096, 2), (512, 768, 3072, 4), (7, 3, 5, 1), (1, 1, 1, 8), (3, 1, 9, 2)] + drawn


@exercise("0.1")
def test_matmul_flops_are_two_per_multiply_add(lab):
    """matmul_cost's FLOPs: every multiply-add of [m, k] @ [k, n] counted as 2, on non-square shapes and a matvec"""
    for m, k, n, b in matmul_cases():
        flops, _ = lab.matmul_cost(m, k, n, b)
        expected = 2 * m * k * n
        assert close(flops, expected), f"matmul_cost({m}, {k}, {n}, {b}): {flops:g} FLOPs, expected {expected:g}"


@exercise("0.1")
def test_matmul_bytes_read_both_inputs_and_write_the_output(lab):
    """matmul_cost's bytes: the least a [m, k] @ [k, n] product moves, for element widths of 1, 2, 4 and 8"""
    for m, k, n, b in matmul_cases():
        _, nbytes = lab.matmul_cost(m, k, n, b)
        expected = (m * k + k * n + m * n) * b
        assert close(nbytes, expected), f"matmul_cost({m}, {k}, {n}, {b}): {nbytes:g} bytes, expected {expected:g}"


@exercise("0.2")
def test_roofline_time_is_set_by_the_slower_resource(lab):
    """roofline_time with compute and memory overlapping: compute-bound, memory-bound, exactly at the ridge,
    and a copy that does no FLOPs at all"""
    rng = random.Random(2)
    cases = [(1e12, 1e9, 1e14, 1e12), (1e9, 1e10, 1e14, 1e12), (2e12, 1e10, 2e14, 1e12), (7, 3, 2, 5),
             (0.0, 2 * 256 * 2 ** 20, 1e12, 5e10), (0, 8e9, 989e12, 3.35e12)]  # copies: bytes only
    for _ in range(20):  # intensities both sides of the ridge, on machines of very different balance
        peak, bw = 10 ** rng.uniform(9, 15), 10 ** rng.uniform(9, 13)
        nbytes = 10 ** rng.uniform(3, 11)
        cases.append((nbytes * peak / bw * 10 ** rng.uniform(-2, 2), nbytes, peak, bw))
    for flops, nbytes, peak, bw in cases:
        t = lab.roofline_time(flops, nbytes, peak, bw)
        expected = max(flops / peak, nbytes / bw)
        assert close(t, expected), (f"roofline_time({flops:g} FLOPs, {nbytes:g} B, {peak:g} FLOP/s, {bw:g} B/s) "
                                    f"= {t:g} s, expected {expected:g} s")


def attention_cases() -> list[tuple[int, int, int, int, int, int]]:
    rng = random.Random(3)
    cases = [(1, 4096, 32, 8, 128, 2), (512, 512, 12, 12, 64, 4), (3, 10, 6, 2, 8, 1), (5, 9, 7, 1, 16, 2),
             (1, 1, 4, 2, 8, 8)]
    for _ in range(20):
        q_len, kv_heads = rng.randint(1, 600), rng.choice((1, 2, 3, 4))
        cases.append((q_len, q_len + rng.randint(0, 3000), kv_heads * rng.choice((2, 3, 5)), kv_heads,
                      rng.choice((16, 40, 64, 96)), rng.choice(WIDTHS)))
    return cases


@exercise("0.3")
def test_attention_flops_count_both_matmuls_on_every_query_head(lab):
    """attention_cost's FLOPs: both matmuls, every (query, key) pair, every query head, with GQA"""
    for q_len, kv_len, heads, kv_heads, d, b in attention_cases():
        flops, _ = lab.attention_cost(q_len, kv_len, heads, kv_heads, d, b)
        expected = 4 * q_len * kv_len * heads * d
        assert close(flops, expected), (f"attention_cost(q_len={q_len}, kv_len={kv_len}, heads={heads}, "
                                        f"kv_heads={kv_heads}, head_dim={d}): {flops:g} FLOPs, expected {expected:g}")


@exercise("0.3")
def test_attention_bytes_read_q_k_v_and_write_the_output(lab):
    """attention_cost's bytes: q, the output, k and v moved once each, with GQA (kv heads fewer than query heads)"""
    for q_len, kv_len, heads, kv_heads, d, b in attention_cases():
        _, nbytes = lab.attention_cost(q_len, kv_len, heads, kv_heads, d, b)
        expected = (2 * q_len * heads * d + 2 * kv_len * kv_heads * d) * b
        assert close(nbytes, expected), (f"attention_cost(q_len={q_len}, kv_len={kv_len}, heads={heads}, "
                                         f"kv_heads={kv_heads}, head_dim={d}, {b} B): {nbytes:g} bytes, "
                                         f"expected {expected:g}")


@exercise("0.4")
def test_kv_cache_bytes_match_an_allocated_cache(lab):
    """kv_cache_bytes equals what a cache of that many tokens allocates (GQA; head_dim not hidden / heads)"""
    rng = random.Random(4)
    cases = [(config(True), 100, 4), (config(True), 37, 2), (config(False), 1, 8)]
    cases += [(cfg, rng.randint(1, 400), rng.choice(WIDTHS)) for cfg in random_configs(40, 8)]
    for cfg, tokens, b in cases:
        expected = ContiguousKVCache(cfg, tokens, DTYPES[b], torch.device("cpu")).nbytes
        formula = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * tokens * b
        assert expected == formula, f"the grader's oracles disagree: a cache allocates {expected} B, formula {formula}"
        got = lab.kv_cache_bytes(cfg, tokens, b)
        assert close(got, expected), \
            f"kv_cache_bytes({shape(cfg)}; {tokens} tokens, {b} B) = {got}, an allocated cache has {expected}"


@cache
def weights_read_per_token(cfg: ModelConfig) -> int:
    """Every parameter minillm's model holds, less the embedding table when it is not the LM head too."""
    params = sum(p.numel() for p in LlamaForCausalLM(cfg).parameters())
    return params - (0 if cfg.tie_word_embeddings else cfg.vocab_size * cfg.hidden_size)


def expected_decode(cfg: ModelConfig, context: int, batch: int, b: int, weights: int) -> tuple[int, int]:
    attention = 4 * context * cfg.num_attention_heads * cfg.head_dim  # one query, one layer
    flops = 2 * weights * batch + cfg.num_hidden_layers * batch * attention
    kv = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * b  # bytes per cached token
    return flops, weights * b + kv * context * batch


def decode_cases() -> list[tuple[ModelConfig, int, int, int]]:
    rng = random.Random(5)
    cases = [(config(tied), context, batch, b) for tied in (False, True)
             for context, batch, b in ((1, 1, 2), (300, 8, 4), (5, 3, 8))]
    cases += [(cfg, rng.randint(1, 2000), rng.randint(2, 64), rng.choice(WIDTHS)) for cfg in random_configs(50, 6)]
    return cases


@exercise("0.5")
def test_decode_step_flops_count_every_token_of_the_batch(lab):
    """decode_step_cost's FLOPs at batch sizes above 1, tied and untied embeddings, contexts of 1 to 2000"""
    for cfg, context, batch, b in decode_cases():
        flops, _ = lab.decode_step_cost(cfg, context, batch, b)
        expected, _ = expected_decode(cfg, context, batch, b, weights_read_per_token(cfg))
        assert close(flops, expected), \
            f"decode_step_cost({shape(cfg)}; context={context}, batch={batch}): {flops:g} FLOPs, expected {expected:g}"


@exercise("0.5")
def test_decode_step_bytes_read_weights_once_and_each_sequences_cache(lab):
    """decode_step_cost's bytes at batch sizes above 1, tied and untied embeddings, contexts of 1 to 2000"""
    for cfg, context, batch, b in decode_cases():
        _, nbytes = lab.decode_step_cost(cfg, context, batch, b)
        _, expected = expected_decode(cfg, context, batch, b, weights_read_per_token(cfg))
        assert close(nbytes, expected), (f"decode_step_cost({shape(cfg)}; context={context}, batch={batch}, {b} B): "
                                         f"{nbytes:g} bytes, expected {expected:g}")


@exercise("0.6")
def test_decode_tokens_per_s_follows_the_roofline(lab):
    """decode_tokens_per_s of the whole batch: memory-bound at small batch, compute-bound at huge batch,
    for weights of 1, 2, 4 or 8 bytes"""
    rng = random.Random(6)
    cases = [(config(False), 64, 1, H100["peak_flops"], H100["bandwidth"], 2),
             (config(False), 64, 16, H100["peak_flops"], H100["bandwidth"], 1),
             (config(False), 1, 100000, H100["peak_flops"], H100["bandwidth"], 1),
             (config(True), 1, 1, H100["peak_flops"], H100["bandwidth"], 4)]
    for cfg in random_configs(60, 4):
        for batch in (1, rng.randint(2, 50), rng.randint(10**5, 10**6)):
            cases.append((cfg, rng.randint(1, 1000), batch, 10 ** rng.uniform(10, 15), 10 ** rng.uniform(9, 13),
                          rng.choice(WIDTHS)))
    bound = set()
    for cfg, context, batch, peak, bw, b in cases:
        flops, nbytes = expected_decode(cfg, context, batch, b, weights_read_per_token(cfg))
        expected = batch / max(flops / peak, nbytes / bw)
        bound.add("compute" if flops / peak > nbytes / bw else "memory")
        got = lab.decode_tokens_per_s(cfg, context, batch, peak, bw, b)
        assert close(got, expected, 1e-6), (f"decode_tokens_per_s({shape(cfg)}; context={context}, batch={batch}, "
                                            f"{peak:g} FLOP/s, {bw:g} B/s, {b} B) = {got:g}, expected {expected:g}")
    assert bound == {"compute", "memory"}, f"test premise: the cases are only {bound}-bound (not your code)"
