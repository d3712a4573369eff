"""Error cancellation: the pure decision on synthetic Qualities (against a brute-force oracle), and
one small real search on tiny."""
import dataclasses
import itertools
import math
import random
import statistics

import pytest
import torch

from minillm.experiments.quant_cancellation import (
    Cancellation,
    LayerSets,
    all_subsets,
    bonferroni_z,
    find_cancellations,
    nll_view,
    paired_difference,
    prefixes,
    search,
)
from minillm.experiments.quant_quality import Quality, Reference
from minillm.experiments.quant_sensitivity import measure
from minillm.quant import QuantConfig, QuantizedLinear


def quality(kl_per_window) -> Quality:
    kl = tuple(float(x) for x in kl_per_window)
    return Quality(perplexity=10.0, kl=statistics.fmean(kl), top1=0.9, tokens=len(kl) * 8, kl_per_window=kl,
                   nll_per_window=tuple(2.3 for _ in kl))


def units(*ids: int) -> frozenset[int]:
    return frozenset(ids)


def test_a_clear_cancellation_is_found_with_its_paired_statistics():
    s = quality([0.10, 0.12, 0.11, 0.13, 0.09, 0.10])
    t = quality([0.05, 0.06, 0.05, 0.07, 0.04, 0.06])   # every window lower by 0.04-0.06
    found = find_cancellations({units(0): s, units(0, 1): t})
    assert len(found) == 1
    c = found[0]
    assert (c.subset, c.superset) == (units(0), units(0, 1))
    d = [a - b for a, b in zip(s.kl_per_window, t.kl_per_window)]
    assert c.kl_subset == pytest.approx(s.kl) and c.kl_superset == pytest.approx(t.kl)
    assert c.delta == pytest.approx(statistics.fmean(d))
    assert c.stderr == pytest.approx(statistics.stdev(d) / math.sqrt(len(d)))
    assert c.z == pytest.approx(c.delta / c.stderr) and c.z > 2


def test_a_lower_mean_within_the_noise_is_not_reported():
    s = quality([0.10, 0.20, 0.05, 0.30, 0.12, 0.08])
    t = quality([0.15, 0.10, 0.12, 0.20, 0.02, 0.14])  # lower on average, but window by window it swings
    delta, stderr, z = paired_difference(s.kl_per_window, t.kl_per_window)
    assert delta > 0 and 0 < z < 2
    assert find_cancellations({units(2): s, units(2, 3): t}) == []
    assert len(find_cancellations({units(2): s, units(2, 3): t}, z=z * 0.99)) == 1  # the threshold decides


def test_equal_errors_are_not_a_cancellation():
    same = [0.1, 0.2, 0.3, 0.4]
    assert find_cancellations({units(0): quality(same), units(0, 1): quality(same)}, z=0.0) == []
    assert paired_difference(same, same) == (0.0, 0.0, 0.0)


def test_a_constant_drop_has_infinite_z_and_comes_first():
    s, t = quality([0.5, 0.75, 1.0]), quality([0.25, 0.5, 0.75])  # exact in binary: every drop is 0.25
    noisy = quality([0.375, 0.25, 0.875])
    found = find_cancellations({units(0): s, units(0, 1): t, units(0, 1, 2): noisy}, z=-math.inf)
    assert found[0].z == math.inf and (found[0].subset, found[0].superset) == (units(0), units(0, 1))
    assert [c.z for c in found] == sorted((c.z for c in found), reverse=True)


def test_sets_that_are_not_nested_are_never_compared():
    high, low = quality([0.5, 0.6, 0.5, 0.6]), quality([0.01, 0.02, 0.01, 0.02])
    results = {units(0, 1): high, units(2): low, units(1, 2): low, units(0, 1, 3): high}
    assert find_cancellations(results) == []  # {2} and {1, 2} are far lower, but no set of them contains {0, 1}


def test_the_nll_view_asks_the_same_question_of_perplexity_with_the_full_model_as_the_empty_set():
    full = dataclasses.replace(quality([0.0] * 4), nll_per_window=(2.0, 2.5, 3.0, 2.2))
    lower = dataclasses.replace(quality([0.01] * 4), nll_per_window=(1.9, 2.41, 2.9, 2.12))  # KL up, NLL down
    results = {units(): full, units(0): lower}
    assert find_cancellations({units(0): lower}) == []
    [c] = find_cancellations(nll_view(results))
    assert (c.subset, c.superset) == (units(), units(0)) and c.kl_subset == pytest.approx(2.425)
    assert c.delta == pytest.approx(0.0925) and c.z > 2


def test_qualities_over_different_windows_are_refused():
    with pytest.raises(ValueError, match="same windows"):
        find_cancellations({units(0): quality([0.1, 0.2]), units(0, 1): quality([0.1, 0.2, 0.3])})
    with pytest.raises(ValueError, match="at least 2"):
        find_cancellations({units(0): quality([0.1]), units(0, 1): quality([0.05])})


def oracle(results: dict[frozenset[int], Quality], z: float) -> set[tuple]:
    """Brute force, written apart: every ordered pair of sets, the paired z from first principles."""
    out = set()
    for s, t in itertools.product(results, repeat=2):
        if not (s.issubset(t) and s != t):
            continue
        d = [a - b for a, b in zip(results[s].kl_per_window, results[t].kl_per_window)]
        mean = sum(d) / len(d)
        sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (len(d) - 1))
        score = mean / (sd / math.sqrt(len(d))) if sd else (math.inf if mean > 0 else 0.0)
        if mean > 0 and score >= z:
            out.add((s, t))
    return out


def random_results(seed: int) -> dict[frozenset[int], Quality]:
    rng = random.Random(seed)
    windows, n_units = rng.choice([2, 3, 5, 12]), rng.choice([3, 4])
    sets = rng.sample(all_subsets(n_units), rng.randint(2 ** n_units // 2, 2 ** n_units - 1))
    # KL grows with the set's size on average; each set's own offset lets some supersets dip below
    # a subset clearly, and the per-window noise leaves other dips within the noise
    level = {s: 0.01 * len(s) + rng.gauss(0, 0.015) for s in sets}
    results = {s: quality([max(0.0, level[s] + rng.gauss(0, 0.004)) for _ in range(windows)]) for s in sets}
    if seed % 5 == 0:  # a tie: a superset with exactly its subset's windows
        results[units(0)] = results[frozenset(range(n_units))] = quality([0.02] * windows)
    return results


def test_seeded_random_results_match_a_brute_force_oracle():
    clear = within_noise = 0
    for seed in range(20):
        results = random_results(seed)
        for z in (0.0, 1.0, 2.0):
            found = find_cancellations(results, z)
            assert {(c.subset, c.superset) for c in found} == oracle(results, z), f"seed {seed}, z {z}"
            assert [c.z for c in found] == sorted((c.z for c in found), reverse=True)
            assert all(c.delta > 0 and c.kl_superset < c.kl_subset for c in found)
        clear += len(oracle(results, 2.0))
        within_noise += len(oracle(results, 0.0) - oracle(results, 2.0))
    assert clear >= 10 and within_noise >= 3  # the inputs exercise both sides of the threshold


def test_search_helpers_count_subsets_prefixes_and_the_bonferroni_threshold():
    assert len(all_subsets(6)) == 63 and all_subsets(2) == [units(0), units(1), units(0, 1)]
    assert prefixes([2, 0, 1]) == [units(2), units(0, 2), units(0, 1, 2)]
    assert bonferroni_z(1) == pytest.approx(1.6449, abs=1e-4)
    assert bonferroni_z(602) > 3.5
    with pytest.raises(ValueError, match="got 7"):
        all_subsets(7)


def test_a_real_search_on_two_layers_of_tiny_measures_each_set_once():
    from minillm import LLM
    model = LLM("tiny", dtype="float32", device="cpu").model
    model.model.layers = model.model.layers[:2]  # two decoder layers: 3 subsets, quick to measure
    windows = torch.randint(1, 4000, (3, 33), generator=torch.Generator().manual_seed(0))
    result = search(model, Reference(model, windows), QuantConfig("int4", group_size=32), seeds=(0,))
    assert result.exhaustive and set(result.results) == set(all_subsets(2))
    assert result.pairs == 2  # {0} < {0, 1} and {1} < {0, 1}
    assert set(result.orders) == {"most sensitive first", "least sensitive first", "random (seed 0)"}
    for q in result.results.values():
        assert len(q.kl_per_window) == 3 and q.kl > 0 and 0 < q.top1 <= 1
    assert all(isinstance(c, Cancellation) and c.subset < c.superset for c in result.cancellations)
    # layers quantized once and swapped in give exactly the model a fresh quantization of the set gives
    reference = Reference(model, windows)
    assert result.results[units(1)] == measure(model, reference, QuantConfig("int4", group_size=32, layers=(1,)))
    assert not any(isinstance(m, QuantizedLinear) for m in model.modules())  # the model searched is left as it was
    with pytest.raises(ValueError, match=r"layers \[2\] out of range"):
        LayerSets(model, QuantConfig("int8")).model(units(0, 2))
