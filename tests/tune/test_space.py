import pytest

from minillm.tune.space import DEFAULTS, SpaceError, configurations, engine_knobs, key, llm_call, parse_space


def test_parse_space_reads_each_knob_s_values():
    assert parse_space(["max_num_seqs=2,8", "enable_prefix_caching=true,False", "quantization=none,int8"]) == {
        "max_num_seqs": [2, 8], "enable_prefix_caching": [True, False], "quantization": ["none", "int8"]}


def test_an_unknown_knob_names_itself_and_the_knobs():
    with pytest.raises(SpaceError, match=r"unknown knob 'max_seqs': the knobs are max_num_seqs, "):
        parse_space(["max_seqs=4"])


def test_a_bad_value_names_it_and_what_is_accepted():
    with pytest.raises(SpaceError, match=r"max_num_seqs='4,zero': each value must be a positive integer"):
        parse_space(["max_num_seqs=4,zero"])
    with pytest.raises(SpaceError, match=r"quantization='int3': each value must be one of none, int8, int4, fp8"):
        parse_space(["quantization=int3"])
    with pytest.raises(SpaceError, match="needs values"):
        parse_space(["block_size"])


def test_configurations_are_the_product_over_the_defaults():
    configs = configurations({"max_num_seqs": [2, 8], "block_size": [16, 32]})
    assert len(configs) == 4 and configs[0] == {**DEFAULTS, "max_num_seqs": 2, "block_size": 16}
    assert key(configs[3]) == "max_num_seqs=8 block_size=32" and key(DEFAULTS) == "defaults"


def test_the_recommendation_is_the_exact_llm_keywords():
    knobs = {**DEFAULTS, "quantization": "int8"}
    assert engine_knobs(knobs)["quantization"].scheme == "int8"
    assert llm_call("tiny", knobs).endswith("num_kv_blocks=1024, quantization=QuantConfig('int8'))")
