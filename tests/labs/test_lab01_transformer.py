"""Grader of lab 01, a transformer from scratch.

Oracles no one here wrote: Hugging Face transformers' Llama modules (LlamaRMSNorm, the rotary
embedding and apply_rotary_pos_emb, LlamaMLP, LlamaDecoderLayer, and LlamaForCausalLM on random
checkpoints it saved itself) and PyTorch's scaled_dot_product_attention. Inputs are seeded random
values of both signs, in shapes where two sizes cannot be confused: tokens, heads and head_dim
differ, and 6 query heads share 2 kv heads, where `repeat` and `repeat_interleave` disagree. The
constants an exercise is given (eps, theta, the config's rms_norm_eps) are drawn at random, far from
the usual defaults, in ranges where a hard-coded default shows; the edge cases the formulas admit
are tried too: a vector of zeros, a single token, attention so sharp that exp() overflows in float32.
"""
import random

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from transformers import LlamaConfig
from transformers.models.llama import modeling_llama as hf_llama

from minillm.labkit import exercise
from minillm.labkit.fixtures import assert_close, checkpoint, one_thread, randn
from minillm.models.model_config import ModelConfig

EXERCISES = {"1.1": "rms_norm", "1.2": "rope_cos_sin", "1.3": "apply_rope", "1.4": "causal_gqa_attention",
             "1.5": "swiglu", "1.6": "decoder_block", "1.7": "transformer_forward"}


def hf_config(**kw) -> LlamaConfig:
    """transformers' config of a small Llama: 6 query heads on 2 kv heads, head_dim (16) != hidden / heads (12)."""
    shape = {"vocab_size": 64, "hidden_size": 72, "intermediate_size": 112, "num_hidden_layers": 1,
             "num_attention_heads": 6, "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 512,
             "rms_norm_eps": 1e-5, "rope_theta": 1000.0}
    return LlamaConfig(**{**shape, **kw}, attn_implementation="eager")  # eager: it honours the mask we pass


def positions_drawn(seed: int, n: int, high: int = 400) -> torch.Tensor:
    """n distinct positions in [0, high), in no particular order."""
    return torch.randperm(high, generator=torch.Generator().manual_seed(seed))[:n]


def rope_tables(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' cos and sin at `positions`: each [n, head_dim]."""
    rope = hf_llama.LlamaRotaryEmbedding(config=hf_config(head_dim=head_dim, rope_theta=theta))
    cos, sin = rope(torch.zeros(1), positions[None])
    return cos[0], sin[0]


def hf_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    norm = hf_llama.LlamaRMSNorm(x.shape[-1], eps=eps)
    norm.weight.data = weight
    with torch.no_grad():
        return norm(x)


@exercise("1.1")
def test_rms_norm_normalises_each_vector_of_a_batch(lab):
    """RMSNorm of [hidden], [tokens, hidden], [batch, tokens, hidden] and 4-d inputs normalises each vector over
    hidden alone"""
    rng = random.Random(10)
    for seed, shape in ((11, (3, 5, 48)), (12, (2, 7, 20)), (13, (6, 33)), (16, (40,)), (17, (2, 3, 4, 12))):
        x = randn(seed, *shape) * randn(seed + 1, *shape[:-1], 1).exp()  # vectors of very different sizes
        weight, eps = randn(seed + 2, shape[-1]), 10 ** rng.uniform(-7, -5)
        assert_close(lab.rms_norm(x, weight, eps), hf_rms_norm(x, weight, eps),
                     f"rms_norm of a {list(shape)} input (eps={eps:.3g})")


@exercise("1.1")
def test_rms_norm_puts_eps_inside_the_square_root(lab):
    """rms_norm with the eps it is given (1e-4 to 0.1) on inputs whose mean square is near eps, and on a vector of
    zeros, matches transformers'"""
    rng = random.Random(14)
    for seed, shape in ((14, (4, 32)), (15, (9, 24)), (18, (3, 2, 16))):
        eps = 10 ** rng.uniform(-4, -1)
        x = randn(seed, *shape, scale=eps ** 0.5 * rng.uniform(0.3, 3))  # mean square about eps
        x[(0,) * (len(shape) - 1)] = 0.0  # one vector of zeros: only eps keeps the root from being 0
        weight = randn(seed + 1, shape[-1])
        assert_close(lab.rms_norm(x, weight, eps), hf_rms_norm(x, weight, eps),
                     f"rms_norm with eps={eps:.3g} of {list(shape)} inputs whose mean square is near eps")


@exercise("1.2")
def test_rope_tables_match_transformers_at_arbitrary_positions(lab):
    """cos/sin rows match transformers' rotary tables at unsorted positions, for several head sizes and thetas"""
    cases = [(torch.tensor([5, 0, 17, 300, 2]), 32, 10000.0), (torch.tensor([5, 0, 17, 300, 2]), 16, 500.0),
             (positions_drawn(16, 9), 24, 1e6), (positions_drawn(17, 3), 64, 123.0), (positions_drawn(18, 12), 8, 2e4)]
    for positions, head_dim, theta in cases:
        expected_cos, expected_sin = rope_tables(positions, head_dim, theta)
        cos, sin = lab.rope_cos_sin(positions, head_dim, theta)
        what = f"rope_cos_sin(positions={positions.tolist()}, head_dim={head_dim}, theta={theta:g})"
        assert_close(cos, expected_cos, f"{what} cos", atol=2e-4)
        assert_close(sin, expected_sin, f"{what} sin", atol=2e-4)


@exercise("1.3")
def test_apply_rope_matches_transformers_rotate_half(lab):
    """rotated vectors match transformers' apply_rotary_pos_emb (several tokens and heads, unsorted positions)"""
    for seed, (n, heads, d) in ((21, (7, 3, 32)), (22, (5, 4, 16)), (23, (2, 6, 64))):
        x = randn(seed, n, heads, d)
        cos, sin = rope_tables(positions_drawn(seed, n), d, 10000.0)
        expected, _ = hf_llama.apply_rotary_pos_emb(x, x, cos, sin, unsqueeze_dim=1)
        assert_close(lab.apply_rope(x, cos, sin), expected, f"apply_rope of a [{n}, {heads}, {d}] input", atol=1e-5)


@exercise("1.3")
def test_apply_rope_scores_depend_only_on_relative_position(lab):
    """q.k after rotation is unchanged when both positions shift by the same amount, and changes with their distance"""
    d = 64
    q, k = randn(24, 5, 3, d), randn(25, 5, 3, d)
    p, s = positions_drawn(26, 5, 200), positions_drawn(27, 5, 200)

    def scores(q_pos, k_pos):
        rq = lab.apply_rope(q, *rope_tables(q_pos, d, 10000.0))
        rk = lab.apply_rope(k, *rope_tables(k_pos, d, 10000.0))
        return (rq * rk).sum(-1)  # [5, 3]: each token's q with its k, per head
    assert_close(scores(p + 137, s + 137), scores(p, s), "q.k with both positions shifted by 137", atol=1e-3)
    assert not torch.allclose(scores(p, s + 3), scores(p, s), atol=1e-2), "q.k does not change with the distance"


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """PyTorch's attention in float64; is_causal aligns the mask top-left, right only when q_len == kv_len."""
    q, k, v = (t.transpose(0, 1).double() for t in (q, k, v))  # SDPA's layout: [heads, len, d]
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)  # [heads, q_len, d]
    return out.transpose(0, 1).float()


@exercise("1.4")
def test_attention_matches_sdpa_on_a_whole_sequence(lab):
    """causal attention over a whole sequence (q_len == kv_len) matches PyTorch's, with GQA and plain heads"""
    for seed, (n, heads, kv_heads, d) in ((31, (9, 6, 2, 16)), (32, (13, 4, 4, 8)), (33, (5, 8, 2, 12))):
        q, k, v = randn(seed, n, heads, d), randn(seed + 1, n, kv_heads, d), randn(seed + 2, n, kv_heads, d)
        expected = sdpa(q, k, v, causal=True)
        assert_close(lab.causal_gqa_attention(q, k, v), expected,
                     f"attention of {n} tokens, {heads} heads on {kv_heads} kv heads", atol=1e-4)


@exercise("1.4")
def test_attention_offsets_the_mask_when_queries_are_the_last_positions(lab):
    """with q_len < kv_len the queries are the last positions: they match the last rows of a whole-sequence attention"""
    for seed, (q_len, kv_len, heads, kv_heads, d) in ((34, (3, 11, 6, 2, 8)), (35, (10, 11, 4, 2, 16)),
                                                      (36, (5, 23, 6, 3, 12))):
        q_all = randn(seed, kv_len, heads, d)
        k, v = randn(seed + 1, kv_len, kv_heads, d), randn(seed + 2, kv_len, kv_heads, d)
        expected = sdpa(q_all, k, v, causal=True)[-q_len:]
        assert_close(lab.causal_gqa_attention(q_all[-q_len:], k, v), expected,
                     f"attention of the last {q_len} of {kv_len} positions", atol=1e-4)


@exercise("1.4")
def test_attention_single_query_sees_every_key(lab):
    """a decode query (q_len = 1) attends over all keys, 6 query heads on 3 or 2 kv heads"""
    for seed, (kv_len, kv_heads) in ((37, (13, 3)), (38, (4, 2))):
        q, k, v = randn(seed, 1, 6, 8), randn(seed + 1, kv_len, kv_heads, 8), randn(seed + 2, kv_len, kv_heads, 8)
        expected = sdpa(q, k, v, causal=False)
        assert_close(lab.causal_gqa_attention(q, k, v), expected, f"attention of 1 query over {kv_len} keys", atol=1e-4)


@exercise("1.4")
def test_attention_stays_right_when_scores_reach_the_hundreds(lab):
    """sharp attention (scaled scores in the hundreds, where exp() overflows float32): the output is still
    PyTorch's, not inf or NaN"""
    for seed, (q_len, kv_len, heads, kv_heads, d) in ((45, (4, 9, 6, 2, 8)), (46, (7, 7, 4, 1, 16))):
        q_all = randn(seed, kv_len, heads, d, scale=12.0)
        k, v = randn(seed + 1, kv_len, kv_heads, d, scale=12.0), randn(seed + 2, kv_len, kv_heads, d)
        scores = torch.einsum("qhd,khd->hqk", q_all, k.repeat_interleave(heads // kv_heads, 1)) / d ** 0.5
        assert scores.abs().max() > 100, "test premise: the scores are not in the hundreds (not your code)"
        assert_close(lab.causal_gqa_attention(q_all[-q_len:], k, v), sdpa(q_all, k, v, causal=True)[-q_len:],
                     f"attention of {q_len} queries over {kv_len} keys with scores in the hundreds", atol=1e-3)


@exercise("1.4")
def test_attention_maps_query_heads_to_their_kv_group(lab):
    """each query head reads the kv head of its group (6 query heads on 2 kv heads, one kv head carrying a signal)"""
    q, k = randn(40, 5, 6, 8), randn(41, 5, 2, 8)
    v = torch.zeros(5, 2, 8)
    v[:, 1] = 1.0  # only kv head 1 carries a signal: query heads 3, 4, 5 must see it, 0, 1, 2 must not
    out = lab.causal_gqa_attention(q, k, v)
    expected = torch.zeros(5, 6, 8)
    expected[:, 3:] = 1.0
    assert_close(out, expected, "which query heads read kv head 1", atol=1e-5)


@exercise("1.4")
def test_attention_each_query_sees_its_own_position_and_no_later_one(lab):
    """changing the key and value at position j changes the query at j and leaves every earlier query alone"""
    with one_thread():
        q_len, kv_len = 4, 10  # queries at positions 6, 7, 8, 9
        q, k, v = randn(42, q_len, 6, 8), randn(43, kv_len, 2, 8), randn(44, kv_len, 2, 8)
        before = lab.causal_gqa_attention(q, k, v)
        for j in range(kv_len):
            k2, v2 = k.clone(), v.clone()
            k2[j], v2[j] = 3.0, -50.0
            after = lab.causal_gqa_attention(q, k2, v2)
            for i in range(q_len):
                position = kv_len - q_len + i
                changed = not torch.allclose(after[i], before[i], atol=1e-5)
                if position < j:
                    assert not changed, f"the query at position {position} changes when the key at position {j} does"
                if position == j:
                    assert changed, f"the query at position {position} ignores the key at its own position"


@exercise("1.5")
def test_swiglu_matches_transformers_mlp(lab):
    """swiglu matches transformers' LlamaMLP, weights stored [out, in] as nn.Linear stores them"""
    for seed, (n, hidden, intermediate) in ((51, (7, 48, 80)), (52, (3, 36, 100))):
        mlp = hf_llama.LlamaMLP(hf_config(hidden_size=hidden, intermediate_size=intermediate))
        for i, linear in enumerate((mlp.gate_proj, mlp.up_proj, mlp.down_proj)):
            linear.weight.data = randn(seed + i, *linear.weight.shape, scale=0.2)
        x = randn(seed + 3, n, hidden)
        with torch.no_grad():
            expected = mlp(x)
        got = lab.swiglu(x, mlp.gate_proj.weight.data, mlp.up_proj.weight.data, mlp.down_proj.weight.data)
        assert_close(got, expected, f"swiglu([{n}, {hidden}], intermediate {intermediate})", atol=1e-4)


def block_case(seed: int, positions: torch.Tensor, **kw) -> tuple[torch.Tensor, dict, ModelConfig, torch.Tensor]:
    """A random transformers decoder layer run over [n, hidden] at `positions`:
    -> (x, its weights by name, the config as minillm reads it, the layer's output)."""
    config = hf_config(**kw)
    layer = hf_llama.LlamaDecoderLayer(config, 0).eval()
    weights = {}
    for i, (name, p) in enumerate(layer.named_parameters()):
        p.data = randn(seed + i, *p.shape, scale=0.15) + (1.0 if "layernorm" in name else 0.0)
        weights[name] = p.data
    n = positions.shape[0]
    x = randn(seed + 50, n, config.hidden_size)
    mask = torch.full((n, n), float("-inf")).triu(1)[None, None]  # token i sees tokens 0..i
    with torch.no_grad():
        cos_sin = hf_llama.LlamaRotaryEmbedding(config=config)(x, positions[None])
        out = layer(x[None], attention_mask=mask, position_ids=positions[None], position_embeddings=cos_sin)
    out = out[0] if isinstance(out, tuple) else out  # older transformers return a tuple
    cfg = ModelConfig.from_dict({**config.to_dict(), "architectures": ["LlamaForCausalLM"]})
    return x, weights, cfg, out[0]


def drawn_constants(rng: random.Random) -> dict:
    """rms_norm_eps from 0.02 to 0.3 (the hidden states' mean square is about 1, so a default 1e-5 or 1e-6
    shows) and rope_theta from 200 to 5e5: neither near a usual default."""
    return {"rms_norm_eps": 10 ** rng.uniform(-1.7, -0.5), "rope_theta": 10 ** rng.uniform(2.3, 5.7)}


@exercise("1.6")
def test_decoder_block_matches_transformers_layer(lab):
    """one decoder layer matches transformers' (GQA and plain multi-head, head_dim * heads != hidden, positions
    0..n-1, rms_norm_eps and rope_theta drawn at random), a single token included"""
    with one_thread():
        rng = random.Random(61)
        other = {"hidden_size": 80, "num_attention_heads": 4, "head_dim": 24}  # 4 on 2, 24 != 80 / 4
        plain = {"num_key_value_heads": 6}  # 6 heads on 6: no grouping
        for seed, n, shape in ((60, 10, {}), (160, 7, other), (260, 5, plain), (360, 1, other)):
            x, w, cfg, expected = block_case(seed, torch.arange(n), **shape, **drawn_constants(rng))
            what = (f"decoder_block, {n} tokens, {cfg.num_attention_heads} heads on {cfg.num_key_value_heads}, "
                    f"rms_norm_eps={cfg.rms_norm_eps:.3g}, rope_theta={cfg.rope_theta:.4g}")
            assert_close(lab.decoder_block(x, torch.arange(n), w, cfg), expected, what, atol=1e-4)


@exercise("1.6")
def test_decoder_block_rotates_by_the_given_positions(lab):
    """a block fed positions with gaps, not starting at 0, matches transformers' at those positions"""
    with one_thread():
        drawn, rng = positions_drawn(71, 9, 300).sort().values, random.Random(72)
        for seed, positions in ((70, torch.tensor([3, 4, 5, 12, 13, 40, 41, 42])), (170, drawn)):
            x, w, cfg, expected = block_case(seed, positions, **drawn_constants(rng))
            assert_close(lab.decoder_block(x, positions, w, cfg), expected,
                         f"decoder_block at positions {positions.tolist()}", atol=1e-4)


def logits_of_prompts(lab, folder, model, seed: int):
    """-> (length, the lab's logits, transformers' logits) for prompts of 12, 5 and 1 tokens, one call each."""
    cfg = ModelConfig.from_file(folder / "config.json")
    weights = load_file(folder / "model.safetensors")
    for n in (12, 5, 1):
        ids = torch.randint(1, cfg.vocab_size, (n,), generator=torch.Generator().manual_seed(seed + n))
        with torch.no_grad():
            expected = model(ids[None]).logits[0]
        yield n, lab.transformer_forward(ids, weights, cfg), expected


@exercise("1.7", timeout=120)
def test_forward_matches_transformers_on_an_untied_checkpoint(lab):
    """logits match transformers' Llama on a checkpoint with its own lm_head (2 layers, GQA 4 on 2, rms_norm_eps
    2.7e-4: the hidden states' mean square is about 1e-3, so a default eps shows)"""
    with one_thread():
        folder, model = checkpoint("llama", 3, rms_norm_eps=2.7e-4)
        for n, actual, expected in logits_of_prompts(lab, folder, model, 81):
            assert_close(actual, expected, f"logits of a {n}-token prompt, untied checkpoint", atol=1e-4)


@exercise("1.7", timeout=120)
def test_forward_matches_transformers_on_a_tied_checkpoint(lab):
    """logits match transformers' Llama on a checkpoint without lm_head (tied; 3 layers, GQA 6 on 2, head_dim 12,
    rms_norm_eps 6.1e-4)"""
    with one_thread():
        folder, model = checkpoint("llama", 4, tie_word_embeddings=True, hidden_size=48, intermediate_size=80,
                                   num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=2, head_dim=12,
                                   rope_theta=2000.0, rms_norm_eps=6.1e-4)
        for n, actual, expected in logits_of_prompts(lab, folder, model, 82):
            assert_close(actual, expected, f"logits of a {n}-token prompt, tied checkpoint", atol=1e-4)
