from minillm.models.model_config import ModelConfig
from minillm.tune.memory_fit import bytes_per_weight, fits, kv_bytes, memory_needed, weight_bytes

# hidden 8, intermediate 16, 2 layers, 2 heads of 4, 1 KV head, vocab 10, tied embeddings
SHAPE = ModelConfig("LlamaForCausalLM", vocab_size=10, hidden_size=8, intermediate_size=16, num_hidden_layers=2,
                    num_attention_heads=2, num_key_value_heads=1, head_dim=4, max_position_embeddings=64,
                    tie_word_embeddings=True)
# a layer: q 8x8, k and v 8x4 each, o 8x8, gate/up/down 3 x 8x16 = 64 + 64 + 64 + 384 = 576 weights
LAYERS = 2 * 576
HEAD = 8 * 10


def test_bytes_per_weight_of_each_scheme():
    assert bytes_per_weight("none", 4) == 4
    assert bytes_per_weight("int8", in_features=8) == 1 + 4 / 8      # a float32 scale per row of 8 inputs
    assert bytes_per_weight("int4", group_size=64) == 0.5 + 8 / 64    # a scale and zero point per group


def test_weight_bytes_count_a_tied_head_once():
    assert weight_bytes(SHAPE, "none", 4) == (LAYERS + HEAD) * 4
    assert weight_bytes(SHAPE, "int8", 4) == round(LAYERS * 1.5 + HEAD * 4)
    untied = ModelConfig(**{**SHAPE.__dict__, "tie_word_embeddings": False})
    assert weight_bytes(untied, "none", 4) == (LAYERS + 2 * HEAD) * 4


def test_kv_bytes_hold_k_and_v_of_every_slot_in_every_layer():
    assert kv_bytes(SHAPE, blocks=3, block_size=16, dtype_bytes=4) == 3 * 16 * 2 * 2 * 1 * 4 * 4


def test_fits_at_the_budget_exactly_and_misses_one_byte_over():
    knobs = {"quantization": "none", "num_kv_blocks": 2, "block_size": 16, "max_num_batched_tokens": 8,
             "max_num_seqs": 2}
    need = memory_needed(SHAPE, knobs)
    assert need["total"] == need["weights"] + need["kv"] + need["activations"]
    assert need["activations"] == 8 * (4 * 8 + 2 * 16) * 4 + 2 * 10 * 4
    assert fits(SHAPE, knobs, need["total"]) == (True, 0)
    assert fits(SHAPE, knobs, need["total"] - 1) == (False, 1)
