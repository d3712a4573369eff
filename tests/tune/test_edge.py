import pytest

from minillm.tune.edge import EdgeError, edge, edge_knobs
from minillm.tune.memory_fit import weight_bytes

MB = 10**6


def ask(tmp_path, profiles, memory, tpot):
    return edge("tiny", memory, tpot, schemes=("none", "int8"), contexts=(256, 512), results=str(tmp_path / "e.json"),
                profiles=profiles)


def test_an_edge_budget_that_fits_gets_the_best_quality_at_its_longest_context(one_thread, tmp_path, profiles,
                                                                               capsys):
    answer = ask(tmp_path, profiles, 200 * MB, 0.05)
    assert answer["scheme"] == "none" and answer["context"] == 512 and answer["KL"] == 0  # fp32 is the reference
    assert answer["knobs"] == edge_knobs("none", 512)
    assert "fits: none at 512 context" in capsys.readouterr().out


def test_an_edge_budget_only_the_quantized_weights_fit(one_thread, tmp_path, profiles):
    from minillm import LLM
    shape = LLM("tiny").engine.model_config
    budget = (weight_bytes(shape, "int8") + weight_bytes(shape, "none")) // 2 + 2 * MB  # int8 fits, fp32 does not
    answer = ask(tmp_path, profiles, budget, 0.05)
    assert answer["scheme"] == "int8" and answer["KL"] > 0


def test_an_edge_budget_that_does_not_fit_names_the_closest_and_the_miss(one_thread, tmp_path, profiles):
    with pytest.raises(EdgeError, match=r"nothing fits: the closest, int8 at 256 context, needs [0-9.]+ MB \(the "
                                        r"budget is 200.0 MB\) and decodes at [0-9.]+ ms a token \(the budget is "
                                        r"0.0 ms\): it misses by"):
        ask(tmp_path, profiles, 200 * MB, 1e-6)


def test_an_edge_budget_smaller_than_the_weights_is_named(tmp_path, profiles):
    with pytest.raises(EdgeError, match=r"the memory budget of 1.0 MB is smaller than the weights alone: the lightest "
                                        r"scheme's need [0-9.]+ MB \(none: [0-9.]+ MB, int8: [0-9.]+ MB\)"):
        ask(tmp_path, profiles, MB, 0.05)
