"""Error cancellation: does quantizing MORE of a model ever give a LOWER error?

Quantizing a set of units S (decoder layers, numbered 0..L-1) moves the model's next-token
distributions by some KL. One would expect a superset T of S to move them further. When it does
not, KL(T) < KL(S), the errors of the extra units partly undo those of S: they cancel.

Is a drop real, or noise? Every set is scored on the same held-out windows, so the question is a
paired one: d_w = KL_w(S) - KL_w(T) for each window w, with mean delta and standard error
stderr = stdev(d) / sqrt(n). A drop counts when z = delta / stderr reaches a threshold (2 by
default). The noise is that of the text sampled (which windows were held out), not of the run: a
measurement is deterministic. Testing hundreds of pairs finds some z >= 2 by chance alone, so
`bonferroni_z` gives the stricter threshold that keeps the chance of any false find at 5%.

The decision (`find_cancellations`) is pure: measured Qualities in, cancellations out. The
measuring (`LayerSets`, `measure_sets`, `search`) quantizes each layer once and measures each set once.
"""
import copy
import itertools
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

import torch

from minillm.experiments.quant_quality import Quality, Reference
from minillm.experiments.quant_sensitivity import orders, quantized_copy
from minillm.quant.quant_config import QuantConfig

MAX_EXHAUSTIVE_UNITS = 6  # 2**6 - 1 = 63 sets; each extra unit doubles the count


@dataclass(frozen=True)
class Cancellation:
    subset: frozenset[int]     # S: the units quantized in the smaller set
    superset: frozenset[int]   # T: a strict superset of S, quantized with lower error
    kl_subset: float           # mean KL(full || quantized S), nats per token
    kl_superset: float         # the same for T (lower)
    delta: float               # mean over windows of KL_w(S) - KL_w(T) (> 0)
    stderr: float              # its standard error over the windows
    z: float                   # delta / stderr (inf when every window drops by the same amount)


def paired_difference(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float]:
    """Per-window figures a and b of the same windows -> (mean of a - b, its standard error, z).
    z is inf for a positive mean with no spread, -inf for a negative one, 0 for no difference."""
    if len(a) != len(b) or len(a) < 2:
        raise ValueError(f"a paired comparison needs two equally long lists of at least 2 windows, "
                         f"got {len(a)} and {len(b)}")
    d = [x - y for x, y in zip(a, b)]
    delta = statistics.fmean(d)
    stderr = statistics.stdev(d) / math.sqrt(len(d))
    z = delta / stderr if stderr > 0 else math.copysign(math.inf, delta) if delta else 0.0
    return delta, stderr, z


def strict_pairs(sets: Iterable[frozenset[int]]) -> list[tuple[frozenset[int], frozenset[int]]]:
    """Every (S, T) of the sets with S a strict subset of T: the pairs a search compares. The empty
    set, where given, is the full-precision model."""
    sets = sorted({frozenset(s) for s in sets}, key=lambda s: (len(s), sorted(s)))
    return [(s, t) for s, t in itertools.permutations(sets, 2) if s < t]


def find_cancellations(results: dict[frozenset[int], Quality], z: float = 2.0) -> list[Cancellation]:
    """Pairs S < T of measured sets where T's per-window KL is lower than S's by at least z standard
    errors (paired over the same windows). results: set of units -> its Quality, each with the same
    number (>= 2) of kl_per_window. -> the cancellations, the most certain (highest z) first."""
    counts = {len(q.kl_per_window) for q in results.values()}
    if len(counts) > 1 or (counts and min(counts) < 2):
        sizes = {tuple(sorted(s)): len(q.kl_per_window) for s, q in results.items()}
        raise ValueError(f"every Quality must carry kl_per_window for the same windows (at least 2); "
                         f"windows per set: {sizes}")
    found = []
    for s, t in strict_pairs(results):
        a, b = results[s], results[t]
        delta, stderr, score = paired_difference(a.kl_per_window, b.kl_per_window)
        if delta > 0 and score >= z:
            found.append(Cancellation(s, t, a.kl, b.kl, delta, stderr, score))
    return sorted(found, key=lambda c: (-c.z, sorted(c.subset), sorted(c.superset)))


def nll_view(results: dict[frozenset[int], Quality]) -> dict[frozenset[int], Quality]:
    """The same results with each window's mean NLL in the place of its KL: find_cancellations on
    them asks whether quantizing more ever lowers the held-out loss itself (perplexity) beyond the
    noise; the Cancellations' kl_ fields then hold mean NLLs."""
    return {s: replace(q, kl=statistics.fmean(q.nll_per_window), kl_per_window=q.nll_per_window)
            for s, q in results.items()}


def bonferroni_z(pairs: int, alpha: float = 0.05) -> float:
    """The one-sided z threshold that keeps the chance of any false cancellation among `pairs`
    comparisons at most alpha (each tested at alpha / pairs)."""
    if pairs < 1:
        raise ValueError(f"pairs must be at least 1, got {pairs}")
    return statistics.NormalDist().inv_cdf(1 - alpha / pairs)


def all_subsets(units: int) -> list[frozenset[int]]:
    """Every non-empty subset of range(units), smallest first: 2**units - 1 of them."""
    if not 1 <= units <= MAX_EXHAUSTIVE_UNITS:
        raise ValueError(f"an exhaustive search takes 1 to {MAX_EXHAUSTIVE_UNITS} units (2**units - 1 "
                         f"measurements), got {units}")
    return [frozenset(c) for n in range(1, units + 1) for c in itertools.combinations(range(units), n)]


def prefixes(order: Sequence[int]) -> list[frozenset[int]]:
    """The growing sets of an order: its first 1, 2, ..., len(order) units."""
    return [frozenset(order[:n]) for n in range(1, len(order) + 1)]


class LayerSets:
    """Models with any set of decoder layers quantized, each layer quantized only once: a quantized
    copy holds every layer in base's scheme, and a working copy swaps them in or out set by set.
    Each linear layer is quantized on its own, so this gives exactly the model that quantizing
    those layers of a fresh copy would (sensitivity.measure), without re-quantizing per set."""

    def __init__(self, model: torch.nn.Module, base: QuantConfig) -> None:
        if "lm_head" in base.projections:  # not inside a decoder layer: swapping layers would leave it out
            raise ValueError(f"sets of decoder layers quantize the layers' projections only; got {base.label()} "
                             f"with lm_head among its projections {list(base.projections)}")
        self.base = base
        self.work = copy.deepcopy(model)
        self.plain = list(self.work.model.layers)
        self.quantized = list(quantized_copy(model, replace(base, layers=None)).model.layers)

    def model(self, layers: frozenset[int]) -> torch.nn.Module:
        """The working copy with exactly `layers` quantized (the others full precision)."""
        bad = sorted(i for i in layers if not 0 <= i < len(self.plain))
        if bad:
            raise ValueError(f"layers {bad} out of range: this model has {len(self.plain)} decoder layers")
        for i in range(len(self.plain)):
            self.work.model.layers[i] = self.quantized[i] if i in layers else self.plain[i]
        return self.work


def measure_sets(sets_of: LayerSets, reference: Reference, sets: Iterable[frozenset[int]],
                 results: dict[frozenset[int], Quality], bar=None) -> dict[frozenset[int], Quality]:
    """Measure each set of decoder layers not yet in results, quantized in sets_of's scheme (in
    place: results is a cache shared by every order and search). -> results."""
    for s in sets:
        if s in results:
            continue
        if bar is not None:
            bar.set_description(f"quant: {sets_of.base.label()} layers {','.join(map(str, sorted(s)))}")
        results[s] = reference.compare(sets_of.model(s))
        if bar is not None:
            bar.update()
    return results


@dataclass
class Search:
    """One scheme's sets of layers, measured: each alone, growing sets in several orders, and (for
    few layers) every subset; with the cancellations found among all of them."""
    base: QuantConfig
    results: dict[frozenset[int], Quality]
    orders: dict[str, list[int]]
    exhaustive: bool
    pairs: int
    z: float                  # the threshold the cancellations passed
    cancellations: list[Cancellation]
    full: Quality             # the full-precision model on the same windows (the empty set)

    def summary(self) -> dict:
        """Counts of the nested pairs where the superset's mean KL is lower at all, at z >= the
        search's threshold, and at the Bonferroni threshold; each cancellation with its perplexity
        change and the paired z of its NLL (the same test on the windows' mean NLL)."""
        strict = bonferroni_z(max(self.pairs, 1))
        found = []
        for c in self.cancellations:
            a, b = self.results[c.subset], self.results[c.superset]
            _, _, nll_z = paired_difference(a.nll_per_window, b.nll_per_window)
            found.append({"subset": sorted(c.subset), "superset": sorted(c.superset), "kl_subset": c.kl_subset,
                          "kl_superset": c.kl_superset, "delta": c.delta, "stderr": c.stderr, "z": c.z,
                          "perplexity_subset": a.perplexity, "perplexity_superset": b.perplexity, "nll_z": nll_z})
        # perplexity: the same test on each window's NLL, with the full model as the empty set
        with_full = nll_view({frozenset(): self.full, **self.results})
        nll_strict = bonferroni_z(len(strict_pairs(with_full)))
        drops = find_cancellations(with_full, z=-math.inf)
        return {"scheme": self.base.label(), "sets_measured": len(self.results), "exhaustive": self.exhaustive,
                "pairs": self.pairs, "superset_lower": len(find_cancellations(self.results, z=-math.inf)),
                "z": self.z, "beyond_z": len(found), "bonferroni_z": strict,
                "beyond_bonferroni": sum(c["z"] >= strict for c in found), "cancellations": found,
                "nll_pairs": len(strict_pairs(with_full)), "nll_lower": len(drops),
                "nll_beyond_z": sum(c.z >= self.z for c in drops), "nll_bonferroni_z": nll_strict,
                "nll_beyond_bonferroni": sum(c.z >= nll_strict for c in drops),
                "nll_drops": [{"subset": sorted(c.subset), "superset": sorted(c.superset),
                               "perplexity_subset": math.exp(c.kl_subset),
                               "perplexity_superset": math.exp(c.kl_superset),
                               "delta_nll": c.delta, "stderr": c.stderr, "z": c.z} for c in drops]}


def search(model: torch.nn.Module, reference: Reference, base: QuantConfig, seeds: tuple[int, ...] = (0, 1, 2),
           exhaustive: bool = True, z: float = 2.0, bar=None) -> Search:
    """Each layer alone, then the growing sets of sensitivity.orders (ranked by the layers' KL),
    then every subset when exhaustive and the model has at most MAX_EXHAUSTIVE_UNITS layers; each
    set measured once. bar: a tqdm bar whose total grows as the sets become known."""
    layers = len(model.model.layers)
    exhaustive = exhaustive and layers <= MAX_EXHAUSTIVE_UNITS
    results: dict[frozenset[int], Quality] = {}
    sets_of = LayerSets(model, base)

    def grow(sets: list[frozenset[int]]) -> None:
        if bar is not None:
            bar.total += len({s for s in sets if s not in results})
            bar.refresh()
        measure_sets(sets_of, reference, sets, results, bar)

    grow([frozenset({i}) for i in range(layers)])
    ranked = orders([results[frozenset({i})].kl for i in range(layers)], seeds)
    grow([s for order in ranked.values() for s in prefixes(order)])
    if exhaustive:
        grow(all_subsets(layers))
    pairs = len(strict_pairs(results))
    return Search(base, results, ranked, exhaustive, pairs, z, find_cancellations(results, z), reference.quality)
