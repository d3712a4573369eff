"""Grader of lab 01, a transformer from scratch. Oracles: minillm's layers and transformers."""
import torch
from safetensors.torch import load_file

from minillm import LLM
from minillm.labkit import exercise
from minillm.labkit.fixtures import assert_close, checkpoint, randn
from minillm.layers.attention import causal_attention
from minillm.layers.mlp import SwiGLUMLP
from minillm.layers.rmsnorm import RMSNorm
from minillm.layers.rotary import RotaryEmbedding
from minillm.models.config import ModelConfig
from minillm.models.llama import DecoderLayer

EXERCISES = {"1.1": "rms_norm", "1.2": "rope_cos_sin", "1.3": "apply_rope", "1.4": "causal_gqa_attention",
             "1.5": "swiglu", "1.6": "decoder_block", "1.7": "transformer_forward"}


def block_config(**kw) -> ModelConfig:
    # head_dim * heads (96) differs from hidden (80): shapes must come from the config, not hidden / heads.
    shape = dict(architecture="LlamaForCausalLM", vocab_size=64, hidden_size=80, intermediate_size=112,
                 num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=24,
                 max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=1000.0)
    return ModelConfig(**{**shape, **kw})


@exercise("1.1")
def test_rms_norm_matches_reference_on_batched_input(lab):
    """RMSNorm of a [batch, tokens, hidden] input matches the formula, per vector"""
    x, w = randn(11, 3, 5, 48), randn(12, 48)
    ref = RMSNorm(48, eps=1e-6)
    ref.weight.data = w
    assert_close(lab.rms_norm(x, w, 1e-6), ref(x), "rms_norm([3, 5, 48])")


@exercise("1.1")
def test_rms_norm_puts_eps_inside_the_square_root(lab):
    """eps is added to the mean square, inside the root (visible on small inputs)"""
    x, w = randn(13, 4, 32, scale=1e-2), randn(14, 32)
    ref = RMSNorm(32, eps=1e-3)
    ref.weight.data = w
    assert_close(lab.rms_norm(x, w, 1e-3), ref(x), "rms_norm with eps=1e-3 on small inputs")


@exercise("1.2")
def test_rope_tables_match_reference_at_arbitrary_positions(lab):
    """cos/sin rows match the rotary table at unsorted positions, for two head sizes and thetas"""
    for head_dim, theta in ((32, 10000.0), (16, 500.0)):
        positions = torch.tensor([5, 0, 17, 300, 2])
        ref = RotaryEmbedding(head_dim, 512, theta)
        cos, sin = lab.rope_cos_sin(positions, head_dim, theta)
        what = f"rope_cos_sin(head_dim={head_dim}, theta={theta})"
        assert_close(cos, ref.cos[positions], f"{what} cos", atol=1e-4)
        assert_close(sin, ref.sin[positions], f"{what} sin", atol=1e-4)


def rotary_reference(n: int, heads: int, d: int, seed: int):
    positions = torch.randperm(200, generator=torch.Generator().manual_seed(seed))[:n]
    rope = RotaryEmbedding(d, 256, 10000.0)
    x = randn(seed, n, heads, d)
    expected, _ = rope(positions, x, x[:, :1])
    return x, rope.cos[positions], rope.sin[positions], expected


@exercise("1.3")
def test_apply_rope_matches_rotate_half_reference(lab):
    """rotated q matches the rotate-half reference (several heads, unsorted positions)"""
    x, cos, sin, expected = rotary_reference(7, 3, 32, seed=21)
    assert_close(lab.apply_rope(x, cos, sin), expected, "apply_rope([7, 3, 32])")


@exercise("1.3")
def test_apply_rope_scores_depend_only_on_relative_position(lab):
    """q.k after rotation is unchanged when both positions shift by the same amount"""
    rope, d = RotaryEmbedding(64, 512, 10000.0), 64
    q, k = randn(22, 1, 2, d), randn(23, 1, 2, d)

    def score(p, s):
        rq = lab.apply_rope(q, rope.cos[[p]], rope.sin[[p]])
        rk = lab.apply_rope(k, rope.cos[[s]], rope.sin[[s]])
        return (rq * rk).sum(-1)
    assert_close(score(9, 4), score(109, 104), "q.k at positions (9, 4) vs (109, 104)", atol=1e-4)
    assert not torch.allclose(score(9, 4), score(9, 8), atol=1e-3), "q.k does not change with the distance"


def naive_attention(q, k, v):
    """float64 loops-free reference: query i at position kv_len - q_len + i sees keys 0..that."""
    q_len, heads, d = q.shape
    kv_len, kv_heads, _ = k.shape
    group = heads // kv_heads
    k, v = k.double().repeat_interleave(group, 1), v.double().repeat_interleave(group, 1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), k) / d ** 0.5
    allowed = torch.arange(kv_len - q_len, kv_len)[:, None] >= torch.arange(kv_len)[None, :]
    probs = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    return torch.einsum("hqk,khd->qhd", probs, v).float()


@exercise("1.4")
def test_attention_matches_reference_on_full_prefill(lab):
    """causal attention over a whole sequence (q_len == kv_len), 8 query heads on 2 kv heads"""
    q, k, v = randn(31, 9, 8, 16), randn(32, 9, 2, 16), randn(33, 9, 2, 16)
    assert_close(lab.causal_gqa_attention(q, k, v), naive_attention(q, k, v), "attention, q_len = kv_len = 9", atol=1e-4)


@exercise("1.4")
def test_attention_offsets_the_mask_when_queries_are_the_last_positions(lab):
    """with q_len < kv_len the queries are the last positions, each sees its own prefix"""
    q, k, v = randn(34, 3, 4, 8), randn(35, 11, 4, 8), randn(36, 11, 4, 8)
    assert_close(lab.causal_gqa_attention(q, k, v), naive_attention(q, k, v), "attention, q_len 3 < kv_len 11", atol=1e-4)


@exercise("1.4")
def test_attention_single_query_sees_every_key(lab):
    """a decode query (q_len = 1) attends over all keys, 6 query heads on 3 kv heads"""
    q, k, v = randn(37, 1, 6, 8), randn(38, 13, 3, 8), randn(39, 13, 3, 8)
    assert_close(lab.causal_gqa_attention(q, k, v), causal_attention(q, k, v), "attention, q_len 1, kv_len 13", atol=1e-4)


@exercise("1.4")
def test_attention_maps_query_heads_to_their_kv_group(lab):
    """query head h reads kv head h // (heads // kv_heads): consecutive query heads share one"""
    q, k = randn(40, 5, 6, 8), randn(41, 5, 2, 8)
    v = torch.zeros(5, 2, 8)
    v[:, 1] = 1.0  # only kv head 1 carries a signal: query heads 3, 4, 5 must see it, 0, 1, 2 must not
    out = lab.causal_gqa_attention(q, k, v)
    expected = torch.zeros(5, 6, 8)
    expected[:, 3:] = 1.0
    assert_close(out, expected, "which query heads read kv head 1", atol=1e-5)


@exercise("1.4")
def test_attention_earlier_queries_ignore_later_keys(lab):
    """changing the last key and value leaves every earlier query's output unchanged"""
    q, k, v = randn(42, 6, 2, 8), randn(43, 6, 2, 8), randn(44, 6, 2, 8)
    k2, v2 = k.clone(), v.clone()
    k2[-1], v2[-1] = 50.0, -50.0
    before, after = lab.causal_gqa_attention(q, k, v), lab.causal_gqa_attention(q, k2, v2)
    assert_close(after[:-1], before[:-1], "earlier queries after the last key changed", atol=1e-5)


@exercise("1.5")
def test_swiglu_matches_reference(lab):
    """SwiGLU MLP matches down(silu(gate x) * up x) with [out, in] weights"""
    mlp = SwiGLUMLP(48, 80)
    w_gate, w_up, w_down = randn(51, 80, 48, scale=0.2), randn(52, 80, 48, scale=0.2), randn(53, 48, 80, scale=0.2)
    mlp.gate_up_proj.weight.data = torch.cat([w_gate, w_up])
    mlp.down_proj.weight.data = w_down
    x = randn(54, 7, 48)
    assert_close(lab.swiglu(x, w_gate, w_up, w_down), mlp(x), "swiglu([7, 48], intermediate 80)", atol=1e-4)


def block_weights(cfg: ModelConfig, seed: int) -> dict[str, torch.Tensor]:
    h, d, i = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    shapes = {"input_layernorm.weight": (h,), "post_attention_layernorm.weight": (h,),
              "self_attn.q_proj.weight": (cfg.num_attention_heads * d, h),
              "self_attn.k_proj.weight": (cfg.num_key_value_heads * d, h),
              "self_attn.v_proj.weight": (cfg.num_key_value_heads * d, h),
              "self_attn.o_proj.weight": (h, cfg.num_attention_heads * d),
              "mlp.gate_proj.weight": (i, h), "mlp.up_proj.weight": (i, h), "mlp.down_proj.weight": (h, i)}
    weights = {name: randn(seed + n, *shape, scale=0.15) for n, (name, shape) in enumerate(shapes.items())}
    for norm in ("input_layernorm.weight", "post_attention_layernorm.weight"):
        weights[norm] = 1 + weights[norm]
    return weights


def reference_block(cfg: ModelConfig, w: dict) -> DecoderLayer:
    layer = DecoderLayer(cfg, 0, RotaryEmbedding(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta))
    layer.input_layernorm.weight.data = w["input_layernorm.weight"]
    layer.post_attention_layernorm.weight.data = w["post_attention_layernorm.weight"]
    layer.self_attn.qkv_proj.weight.data = torch.cat([w[f"self_attn.{p}_proj.weight"] for p in "qkv"])
    layer.self_attn.o_proj.weight.data = w["self_attn.o_proj.weight"]
    layer.mlp.gate_up_proj.weight.data = torch.cat([w["mlp.gate_proj.weight"], w["mlp.up_proj.weight"]])
    layer.mlp.down_proj.weight.data = w["mlp.down_proj.weight"]
    return layer


@exercise("1.6")
def test_decoder_block_matches_reference_layer(lab):
    """one decoder layer matches minillm's (GQA 4 on 2, head_dim * heads != hidden, positions 0..n-1)"""
    cfg = block_config()
    w, x = block_weights(cfg, 60), randn(61, 10, cfg.hidden_size)
    positions = torch.arange(10)
    with torch.no_grad():
        expected = reference_block(cfg, w)(positions, x, None)
    assert_close(lab.decoder_block(x, positions, w, cfg), expected, "decoder_block, 10 tokens", atol=1e-4)


@exercise("1.6")
def test_decoder_block_rotates_by_the_given_positions(lab):
    """a block fed positions with gaps (0 1 2 9 10 30 31 32) matches the reference at those positions"""
    cfg = block_config(num_attention_heads=6, num_key_value_heads=3, head_dim=16, hidden_size=72)
    w, x = block_weights(cfg, 70), randn(71, 8, cfg.hidden_size)
    positions = torch.tensor([0, 1, 2, 9, 10, 30, 31, 32])
    with torch.no_grad():
        expected = reference_block(cfg, w)(positions, x, None)
    assert_close(lab.decoder_block(x, positions, w, cfg), expected, "decoder_block at positions with gaps", atol=1e-4)


@exercise("1.7", timeout=120)
def test_forward_matches_transformers_on_untied_checkpoint(lab):
    """logits match transformers' Llama on a checkpoint with its own lm_head (untied, GQA 4 on 2)"""
    folder, hf = checkpoint("llama", 3)
    cfg = ModelConfig.from_file(folder / "config.json")
    ids = torch.randint(1, cfg.vocab_size, (12,), generator=torch.Generator().manual_seed(81))
    with torch.no_grad():
        expected = hf(ids[None]).logits[0]
    actual = lab.transformer_forward(ids, load_file(folder / "model.safetensors"), cfg)
    assert_close(actual, expected, "logits of a 12-token prompt, untied checkpoint", atol=1e-4)


@exercise("1.7", timeout=120)
def test_forward_matches_minillm_on_the_bundled_model(lab):
    """logits match minillm's on the bundled tiny model (tied embeddings, 6 layers)"""
    llm = LLM("tiny")
    cfg = llm.model.config
    ids = torch.randint(1, cfg.vocab_size, (20,), generator=torch.Generator().manual_seed(82))
    weights = load_file(llm.engine.model_dir / "model.safetensors")
    actual = lab.transformer_forward(ids, weights, cfg)
    assert_close(actual, llm.logits(ids), "logits of a 20-token prompt, tiny", atol=1e-3)
