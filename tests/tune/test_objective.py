import math

import pytest

from minillm.tune.objective import cost_per_million, dominates, goodput_objective, pareto_front


def lat(ttft, tpot, e2e):
    return {"ttft": ttft, "tpot": tpot, "e2e": e2e}


def test_goodput_counts_requests_meeting_every_slo_per_second():
    requests = [lat(0.5, 0.01, 1.0), lat(1.5, 0.01, 2.0), lat(0.5, 0.2, 3.0), lat(0.2, None, 0.2)]
    assert goodput_objective(requests, 2.0, {"ttft": 1.0}) == 3 / 2
    assert goodput_objective(requests, 2.0, {"ttft": 1.0, "tpot": 0.05}) == 2 / 2  # a None TPOT meets any limit
    assert goodput_objective(requests, 2.0, {"ttft": 1.0, "tpot": 0.05, "e2e": 0.5}) == 1 / 2


def test_goodput_a_value_at_its_limit_meets_it():
    assert goodput_objective([lat(1.0, 0.05, 2.0)], 1.0, {"ttft": 1.0, "tpot": 0.05, "e2e": 2.0}) == 1.0
    assert goodput_objective([lat(1.0 + 1e-9, 0.05, 2.0)], 1.0, {"ttft": 1.0}) == 0.0


def test_goodput_without_slo_is_the_request_rate():
    assert goodput_objective([lat(9, 9, 9)] * 3, 1.5, {}) == 2.0


def test_goodput_rejects_a_duration_that_is_not_positive():
    with pytest.raises(ValueError, match="duration must be > 0"):
        goodput_objective([], 0.0, {})


def point(name, goodput, ttft, memory):
    return {"configuration": name, "goodput": goodput, "ttft_p99": ttft, "memory_mb": memory}


def test_pareto_front_keeps_the_points_no_other_beats_everywhere():
    a, b, c, d = point("a", 10, 1.0, 100), point("b", 8, 0.5, 100), point("c", 7, 0.6, 120), point("d", 12, 2.0, 50)
    assert pareto_front([a, b, c, d]) == [a, b, d]  # c: b has more goodput, less TTFT and memory


def test_pareto_front_keeps_equal_points_and_drops_a_point_worse_on_one_axis_only():
    a, twin, worse = point("a", 10, 1.0, 100), point("twin", 10, 1.0, 100), point("w", 10, 1.0, 101)
    assert pareto_front([a, twin, worse]) == [a, twin]
    assert not dominates(a, twin, "goodput", ("ttft_p99", "memory_mb"))
    assert dominates(a, worse, "goodput", ("ttft_p99", "memory_mb"))


def test_pareto_front_of_one_point_and_of_none():
    assert pareto_front([point("a", 0, 0, 0)]) == [point("a", 0, 0, 0)]
    assert pareto_front([]) == []


def test_cost_per_million_interactive_against_batch():
    assert math.isclose(cost_per_million(3.6, 1000.0), 1.0)   # $3.6/h = $0.001/s; 1e6 tokens take 1000 s
    assert math.isclose(cost_per_million(3.6, 100.0) / cost_per_million(3.6, 1000.0), 10.0)  # batch 10x the tokens/s
    with pytest.raises(ValueError, match="tokens_per_second must be > 0"):
        cost_per_million(1.0, 0.0)
