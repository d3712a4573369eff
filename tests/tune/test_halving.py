import pytest

from minillm.tune.halving import halving_round, rungs


def test_halving_round_keeps_the_best_and_counts_its_runs():
    assert halving_round([("a", 1.0), ("b", 3.0), ("c", 2.0), ("d", 0.5)], 2) == (["b", "c"], 4)


def test_halving_round_breaks_a_tie_by_the_order_given():
    assert halving_round([("a", 1.0), ("b", 2.0), ("c", 2.0)], 1) == (["b"], 3)
    assert halving_round([("c", 2.0), ("b", 2.0)], 1) == (["c"], 2)


def test_halving_round_keeps_every_candidate_when_asked_for_more():
    assert halving_round([("a", 1.0)], 3) == (["a"], 1)
    with pytest.raises(ValueError, match="keeps at least 1"):
        halving_round([("a", 1.0)], 0)


def test_rungs_halve_the_candidates_and_double_the_requests():
    assert rungs(8, 64) == [(8, 8), (4, 16), (2, 32), (1, 64)]
    assert rungs(4, 64, min_requests=4) == [(4, 16), (2, 32), (1, 64)]
    assert rungs(1, 10) == [(1, 10)]
    assert rungs(3, 8) == [(3, 8), (1, 8)]  # never below min_requests, never above max_requests
