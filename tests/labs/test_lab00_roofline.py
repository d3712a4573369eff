"""Grader of lab 00, the roofline and the memory wall. Oracles: formulas and minillm's model and cache."""
import torch

from minillm.cache.contiguous import ContiguousKVCache
from minillm.labkit import exercise
from minillm.models.config import ModelConfig
from minillm.models.llama import LlamaForCausalLM

EXERCISES = {"0.1": "matmul_cost", "0.2": "roofline_time", "0.3": "attention_cost", "0.4": "kv_cache_bytes",
             "0.5": "decode_step_cost", "0.6": "decode_tokens_per_s"}
H100 = dict(peak_flops=989e12, bandwidth=3.35e12)


def config(tied: bool) -> ModelConfig:
    return ModelConfig(architecture="LlamaForCausalLM", vocab_size=500, hidden_size=96, intermediate_size=160,
                       num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=2, head_dim=24,
                       max_position_embeddings=256, tie_word_embeddings=tied)


def weights_read_per_token(cfg: ModelConfig) -> int:
    """Every parameter minillm's model holds, less the embedding table when it is not the LM head too."""
    params = sum(p.numel() for p in LlamaForCausalLM(cfg).parameters())
    return params - (0 if cfg.tie_word_embeddings else cfg.vocab_size * cfg.hidden_size)


def close(a, b, rel=1e-9) -> bool:
    return abs(a - b) <= rel * abs(b)


@exercise("0.1")
def test_matmul_cost_counts_multiply_adds_and_three_matrices(lab):
    """a [m, k] @ [k, n] matmul: 2mkn FLOPs; reads both inputs and writes the output once"""
    for m, k, n, b in ((1, 4096, 4096, 2), (512, 768, 3072, 4), (7, 3, 5, 1)):
        flops, nbytes = lab.matmul_cost(m, k, n, b)
        assert close(flops, 2 * m * k * n), f"matmul_cost({m}, {k}, {n}) FLOPs = {flops}, expected {2 * m * k * n}"
        expected = (m * k + k * n + m * n) * b
        assert close(nbytes, expected), f"matmul_cost({m}, {k}, {n}, {b}) bytes = {nbytes}, expected {expected}"


@exercise("0.2")
def test_roofline_time_is_set_by_the_slower_resource(lab):
    """time = max(compute time, memory time), in both regimes"""
    cases = ((1e12, 1e9, 1e14, 1e12), (1e9, 1e10, 1e14, 1e12), (5e13, 5e10, 1e14, 1e12))
    for flops, nbytes, peak, bw in cases:
        t = lab.roofline_time(flops, nbytes, peak, bw)
        expected = max(flops / peak, nbytes / bw)
        assert close(t, expected), f"roofline_time({flops:g} FLOPs, {nbytes:g} B) = {t:g} s, expected {expected:g} s"


@exercise("0.3")
def test_attention_cost_counts_both_matmuls_over_all_heads(lab):
    """FLOPs of q.k and p.v for every query head; bytes of q, k, v (kv heads only) and the output"""
    for q_len, kv_len, heads, kv_heads, d, b in ((1, 4096, 32, 8, 128, 2), (512, 512, 12, 12, 64, 4), (3, 10, 6, 2, 8, 1)):
        flops, nbytes = lab.attention_cost(q_len, kv_len, heads, kv_heads, d, b)
        exp_flops = 4 * q_len * kv_len * heads * d
        exp_bytes = (2 * q_len * heads * d + 2 * kv_len * kv_heads * d) * b
        what = f"attention_cost(q_len={q_len}, kv_len={kv_len}, heads={heads}, kv_heads={kv_heads})"
        assert close(flops, exp_flops), f"{what}: {flops:g} FLOPs, expected {exp_flops:g}"
        assert close(nbytes, exp_bytes), f"{what}: {nbytes:g} bytes, expected {exp_bytes:g}"


@exercise("0.4")
def test_kv_cache_bytes_match_an_allocated_cache(lab):
    """bytes of K and V for every layer and kv head, as minillm's cache allocates them"""
    cfg = config(tied=True)
    for tokens, dtype, b in ((100, torch.float32, 4), (37, torch.bfloat16, 2)):
        expected = ContiguousKVCache(cfg, tokens, dtype, torch.device("cpu")).nbytes
        got = lab.kv_cache_bytes(cfg, tokens, b)
        assert close(got, expected), f"kv_cache_bytes({tokens} tokens, {b} B) = {got}, an allocated cache has {expected}"


def expected_decode(cfg, context, batch, b):
    p = weights_read_per_token(cfg)
    attn = 4 * context * cfg.num_attention_heads * cfg.head_dim
    flops = 2 * p * batch + cfg.num_hidden_layers * batch * attn
    nbytes = p * b + 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * context * batch * b
    return flops, nbytes


@exercise("0.5")
def test_decode_step_cost_counts_weights_once_and_each_sequences_cache(lab):
    """a decode step reads every weight once (not the embedding table) and each sequence's KV"""
    for tied in (False, True):
        cfg = config(tied)
        for context, batch, b in ((1, 1, 2), (300, 8, 4)):
            flops, nbytes = lab.decode_step_cost(cfg, context, batch, b)
            exp_flops, exp_bytes = expected_decode(cfg, context, batch, b)
            what = f"decode_step_cost(tied={tied}, context={context}, batch={batch})"
            assert close(nbytes, exp_bytes), f"{what}: {nbytes:g} bytes, expected {exp_bytes:g}"
            assert close(flops, exp_flops), f"{what}: {flops:g} FLOPs, expected {exp_flops:g}"


@exercise("0.6")
def test_decode_tokens_per_s_follows_the_roofline(lab):
    """tokens/s = batch / roofline time of one step, memory-bound at batch 1, compute-bound at huge batch"""
    cfg = config(tied=False)
    for context, batch in ((64, 1), (64, 16), (8, 100000)):
        flops, nbytes = expected_decode(cfg, context, batch, 2)
        expected = batch / max(flops / H100["peak_flops"], nbytes / H100["bandwidth"])
        got = lab.decode_tokens_per_s(cfg, context, batch, H100["peak_flops"], H100["bandwidth"], 2)
        assert close(got, expected, 1e-6), f"decode_tokens_per_s(batch={batch}) = {got:g}, expected {expected:g}"
