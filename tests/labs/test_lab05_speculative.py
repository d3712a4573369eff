"""Grader of lab 05, speculative decoding.

Oracles: the formulas of Leviathan et al. 2023 and Chen et al. 2023 (the rejection rule, the
residual, tokens per forward), computed here from first principles; minillm's prompt lookup
(minillm/speculative/ngram.py); PyTorch's kl_div for the distillation loss; and for 5.E the real engine
with the notebook's verifier and proposer against the engine with its own.

Sampling is graded by its distribution, never by the exact random numbers a verifier draws (the
exercise text leaves their order open): chi-square tests over many seeded draws. Each such check
fails a correct solution by chance with probability FALSE_ALARM = 1e-6; there are 26 of them, so
the whole grader fails a correct solution by chance with probability below 3e-5. The draws are
seeded, so a given solution passes or fails the same way on every run: the probability is over
the correct solutions a learner may write, each drawing its random numbers in its own order.
The statistical tests run on one torch thread (`one_thread`): a verify call on tensors this small
takes 0.1 to 0.3 ms there, and many times that on a busy machine's thread pool.
"""
import dataclasses
import fractions
import math
import random
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

from minillm import LLM, SamplingParams
from minillm.config import Components, SpeculativeConfig
from minillm.labkit import exercise
from minillm.labkit.endtoend import MODEL, check_against_reference
from minillm.labkit.fixtures import assert_close, one_thread, randn
from minillm.labkit.plug import lab_components
from minillm.models.registry import BUNDLED_DIR
from minillm.speculative.heads import HEADS_FILE, SpecHeads, save_heads
from minillm.speculative.heads import propose_heads as reference_propose_heads
from minillm.speculative.ngram import propose_ngram as reference_propose_ngram
from minillm.speculative.verify import target_probs

EXERCISES = {"5.1": "accept", "5.2": "residual", "5.3": "verify", "5.4": "propose_ngram",
             "5.5": "expected_tokens_per_forward", "5.6": "distill_loss", "5.7": "propose_heads",
             "5.E": "your verifier and prompt lookup in the real engine"}

# A correct solution fails a chi-square check with probability FALSE_ALARM. A wrong one gives a statistic of
# about N * D for N draws, D its chi-square divergence from the right distribution: with df <= 7 a statistic
# over 45 is past the threshold, so 2500 draws catch any D > 0.02, 5000 draws any D > 0.01.
FALSE_ALARM = 1e-6


def sampling_params(seed: int, count: int) -> list[tuple[float, int, float]]:
    """(temperature, top_k, top_p): plain sampling at temperature 1 first, then `count` seeded draws far from
    the defaults (a temperature well below or above 1, a top-k of 3 to 5 and a top-p of 0.7 to 0.9, which on the
    six- to eight-token vocabularies here cut real mass), so that a verifier that hard-codes or drops any of the
    three draws from another distribution."""
    rng = random.Random(seed)
    drawn = [(round(rng.choice([rng.uniform(0.4, 0.7), rng.uniform(1.4, 2.2)]), 3), rng.randint(3, 5),
              round(rng.uniform(0.7, 0.9), 3)) for _ in range(count)]
    return [(1.0, 0, 1.0), *drawn]


PARAMS = sampling_params(5, 1)  # the statistical tests of 5.3: two settings, each a few thousand verify calls


def chi_square_p_value(counts: torch.Tensor, expected: torch.Tensor) -> float:
    """P(a chi-square statistic at least this large | the draws follow `expected`), df = support - 1."""
    counts, expected = counts.double(), expected.double()
    support = expected > 0
    draws = counts.sum()
    stat = (((counts - draws * expected) ** 2) / (draws * expected))[support].sum()
    df = int(support.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), stat / 2))


def assert_distributed_as(counts: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    """counts of draws over tokens (or outcomes) against the distribution they must follow."""
    outside = int(counts[expected == 0].sum())
    assert not outside, f"{what}: {outside} draws fell on tokens of probability 0"
    got = (counts / counts.sum()).tolist()
    p_value = chi_square_p_value(counts, expected)
    assert p_value > FALSE_ALARM, (
        f"{what}: the frequencies over {int(counts.sum())} draws, {[round(g, 3) for g in got]}, do not follow "
        f"{[round(e, 3) for e in expected.tolist()]} (chi-square p-value {p_value:.1e})")


def probs(seed: int, *shape: int, scale: float = 1.0) -> torch.Tensor:
    return (randn(seed, *shape) * scale).softmax(-1)


# -- 5.1 the rejection step --------------------------------------------------------------------
@exercise("5.1")
def test_accept_keeps_every_token_the_proposer_under_proposes(lab):
    """p >= q (q = 0 and p = q included) keeps the token every time"""
    gen = torch.Generator().manual_seed(51)
    pairs = [(0.3, 0.3), (0.5, 0.2), (1.0, 1e-4), (0.2, 0.0), (1.0, 1.0), (0.07, 0.069)]
    pairs += [(max(a, b), min(a, b)) for a, b in torch.rand(20, 2, generator=gen).tolist()]
    with one_thread():
        kept_of = [(p, q, sum(bool(lab.accept(p, q, gen)) for _ in range(200))) for p, q in pairs]
    for p, q, kept in kept_of:
        assert kept == 200, f"accept(p={p:.4g}, q={q:.4g}) kept the token {kept} times of 200; p >= q keeps it always"


@exercise("5.1")
def test_accept_never_keeps_a_token_the_target_excludes(lab):
    """p = 0 rejects the token every time"""
    gen = torch.Generator().manual_seed(52)
    for q in (1.0, 0.5, 0.01):
        with one_thread():
            kept = sum(bool(lab.accept(0.0, q, gen)) for _ in range(500))
        assert kept == 0, f"accept(p=0, q={q}) kept the token {kept} times of 500; the target never emits it"


@exercise("5.1")
def test_accept_keeps_with_probability_p_over_q(lab):
    """for p < q the token is kept as often as exact speculative sampling keeps it (seeded random pairs, 4000 draws
    each, chi-square)"""
    gen = torch.Generator().manual_seed(53)
    pairs = [(0.1, 0.9), (0.45, 0.5), (0.01, 0.02)]
    pairs += [(min(a, b), max(a, b)) for a, b in torch.rand(9, 2, generator=gen).tolist() if abs(a - b) > 0.01]
    for p, q in pairs:
        with one_thread():
            kept = sum(bool(lab.accept(p, q, gen)) for _ in range(4000))
        assert_distributed_as(torch.tensor([kept, 4000 - kept]), torch.tensor([p / q, 1 - p / q]),
                              f"accept(p={p:.3f}, q={q:.3f}): kept, rejected")


@exercise("5.1")
def test_accept_draws_from_the_generator_it_is_given(lab):
    """two generators of one seed give the same decisions; another seed gives others"""
    draws = torch.rand(64, 2, generator=torch.Generator().manual_seed(54)).tolist()
    pairs = [(a * 0.5, 0.5 + b * 0.5) for a, b in draws]  # p < q: every decision is random

    def decisions(seed):
        gen = torch.Generator().manual_seed(seed)
        with one_thread():
            return [bool(lab.accept(p, q, gen)) for p, q in pairs]
    assert decisions(3) == decisions(3), "the same seed gave different decisions: randomness not from the generator"
    assert decisions(3) != decisions(4), "seeds 3 and 4 gave the same 64 decisions"


# -- 5.2 the residual --------------------------------------------------------------------------
def residual_formula(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    r = torch.where(p > q, p - q, torch.zeros_like(p))
    return r / r.sum()


def residual_of(lab, p: torch.Tensor, q: torch.Tensor, what: str) -> torch.Tensor:
    p_before, q_before = p.clone(), q.clone()
    r = lab.residual(p, q)
    assert torch.equal(p, p_before) and torch.equal(q, q_before), f"{what}: residual changed its input p or q"
    assert isinstance(r, torch.Tensor) and r.is_floating_point() and r.shape == p.shape, \
        (f"{what}: returns {type(r).__name__} {getattr(r, 'dtype', '')} of shape {tuple(getattr(r, 'shape', ()))}, "
         f"not a float tensor of shape {tuple(p.shape)}")
    return r


def composition(rng: random.Random, total: int, parts: int) -> list[int]:
    """`parts` non-negative integers summing to `total`, uniformly spread cut points."""
    cuts = sorted(rng.randint(0, total) for _ in range(parts - 1))
    return [b - a for a, b in zip([0, *cuts], [*cuts, total])]


def dyadic_pair(seed: int, vocab: int, bits: int, mass_bits: int, dtype=torch.float32):
    """p and q whose values are multiples of 2^-bits, summing to 1, with a residual mass sum(max(0, p - q)) of
    exactly 2^(mass_bits - bits): every difference, every partial sum (in any order) and the division by a power
    of two are then exact in `dtype`, so every correct residual gives the same bits. -> p, q, the exact residual."""
    rng = random.Random(seed)
    tokens = rng.sample(range(vocab), vocab)
    n_plus = rng.randint(1, vocab - 1)
    plus, minus = tokens[:n_plus], tokens[n_plus:n_plus + rng.randint(1, vocab - n_plus)]
    mass = 2 ** mass_bits
    base = composition(rng, 2 ** bits - mass, vocab)
    base = [0 if rng.random() < 0.2 else b for b in base]  # zeros: tokens both exclude (top-k, say)
    base[tokens[-1]] += 2 ** bits - mass - sum(base)
    d_plus, d_minus = [0] * vocab, [0] * vocab
    for token, part in zip(plus, composition(rng, mass, len(plus))):
        d_plus[token] = part
    for token, part in zip(minus, composition(rng, mass, len(minus))):
        d_minus[token] = part
    unit = 2.0 ** -bits
    as_probs = lambda ints: torch.tensor([i * unit for i in ints], dtype=dtype)  # noqa: E731
    exact = torch.tensor([d / mass for d in d_plus], dtype=dtype)
    return as_probs([b + d for b, d in zip(base, d_plus)]), as_probs([b + d for b, d in zip(base, d_minus)]), exact


def assert_exact(got: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    wrong = (got.double() != expected.double()).nonzero().flatten().tolist()
    assert not wrong, (f"{what}: differs from the exact residual at tokens {wrong[:5]} (got "
                       f"{[float(got[i]) for i in wrong[:3]]}, exactly {[float(expected[i]) for i in wrong[:3]]})")


@exercise("5.2")
def test_residual_is_the_normalised_positive_part_of_p_minus_q(lab):
    """the residual is the distribution exact speculative sampling draws from after a rejection, on seeded random p
    and q (some with zeros), vocabularies 5 to 60"""
    for seed in range(520, 544):
        vocab = 5 + (seed * 7) % 56
        p, q = probs(seed, vocab, scale=1 + seed % 3), probs(seed + 100, vocab, scale=2)
        if seed % 3 == 0:  # some tokens the target's filters excluded, others the proposer never proposes
            p = torch.where(torch.arange(vocab) % 4 == 1, 0.0, p)
            p, q = p / p.sum(), torch.where(torch.arange(vocab) % 5 == 2, 0.0, q)
            q = q / q.sum()
        what = f"residual on seeded p, q over {vocab} tokens (seed {seed})"
        # float32 rounding: a sum of at most 60 values in [0, 1] is off by < 60 * 2^-24 = 4e-6 of itself
        assert_close(residual_of(lab, p, q, what), residual_formula(p, q), what, atol=1e-6)


@exercise("5.2")
def test_residual_is_exact_where_every_step_is(lab):
    """p, q on a grid of 2^-bits with a residual mass that is a power of two, so every correct residual gives
    the exact result: vocabularies 2 to 300, masses 1/2 down to 2^-24 in float32 and 2^-44 in float64"""
    rng = random.Random(525)
    cases = [(float32, rng.randint(2, 300), bits, rng.randint(0, bits - 1))
             for float32, bits in [(True, 12)] * 12 + [(True, 24)] * 4]
    cases += [(True, 2, 24, 0), (True, 7, 24, 0), (False, 40, 44, 0), (False, 9, 50, rng.randint(1, 20))]
    for case, (float32, vocab, bits, mass_bits) in enumerate(cases):
        dtype = torch.float32 if float32 else torch.float64
        p, q, exact = dyadic_pair(5250 + case, vocab, bits, mass_bits, dtype)
        what = (f"residual over {vocab} tokens in {dtype}, p and q multiples of 2^-{bits}, residual mass "
                f"2^-{bits - mass_bits}")
        assert_exact(residual_of(lab, p, q, what), exact, what)


@exercise("5.2")
def test_residual_of_a_disjoint_proposer_is_p(lab):
    """a q with no mass where p has any leaves the residual equal to p, exactly (p on a dyadic grid)"""
    for seed in (531, 532, 533):
        rng = random.Random(seed)
        vocab = rng.randint(4, 40)
        tokens = rng.sample(range(vocab), vocab)
        cut = rng.randint(1, vocab - 1)
        p, q = [0.0] * vocab, [0.0] * vocab
        for token, part in zip(tokens[:cut], composition(rng, 2 ** 16, cut)):
            p[token] = part * 2.0 ** -16
        for token, part in zip(tokens[cut:], composition(rng, 2 ** 16, vocab - cut)):
            q[token] = part * 2.0 ** -16
        p, q = torch.tensor(p), torch.tensor(q)
        what = f"residual over {vocab} tokens with q's mass only where p is 0 (seed {seed})"
        assert_exact(residual_of(lab, p, q, what), p, what)


@exercise("5.2")
def test_residual_after_a_certain_proposal_is_p_without_it(lab):
    """q one-hot at x (a proposal made with certainty): the residual is p with x removed, renormalised (exact
    where p(x) = 1/2 or 3/4, to float32 rounding elsewhere)"""
    p = probs(534, 9)
    for x in (0, 4, 8):
        q = F.one_hot(torch.tensor(x), 9).float()
        expected = p.clone()
        expected[x] = 0
        what = f"residual with q one-hot at token {x}"
        assert_close(residual_of(lab, p, q, what), expected / expected.sum(), what, atol=1e-6)
    for x, share in ((2, 0.5), (5, 0.75)):
        rest = composition(random.Random(x), 2 ** 12, 8)
        exact = torch.tensor([r * 2.0 ** -12 for r in rest[:x]] + [0.0] + [r * 2.0 ** -12 for r in rest[x:]])
        p_exact = exact * (1 - share)  # a power of two times each value: still exact
        p_exact[x] = share
        what = f"residual with q one-hot at token {x}, which has p = {share}"
        assert_exact(residual_of(lab, p_exact, F.one_hot(torch.tensor(x), 9).float(), what), exact, what)


@exercise("5.2")
def test_residual_of_identical_distributions_is_p(lab):
    """p == q: nothing is left, and the residual is p itself, a distribution (no NaN); one token included"""
    for seed in (535, 536):
        p = probs(seed, 7)
        what = f"residual(p, p) (seed {seed})"
        assert_close(residual_of(lab, p, p.clone(), what), p, what, atol=1e-7)
    for p in (torch.tensor([1.0]), torch.tensor([0.25, 0.0, 0.5, 0.125, 0.125]), torch.tensor([0.5, 0.5])):
        what = f"residual(p, p) with p = {p.tolist()}"
        assert_exact(residual_of(lab, p, p.clone(), what), p, what)


# -- 5.3 the verifier ---------------------------------------------------------------------------
def as_pair(result, what: str) -> tuple[int, int]:
    assert isinstance(result, tuple) and len(result) == 2, f"{what}: returns {result!r}, not a pair (accepted, token)"
    accepted, token = result
    assert isinstance(accepted, int) and isinstance(token, int), \
        f"{what}: returns ({type(accepted).__name__}, {type(token).__name__}), not two Python ints"
    return accepted, token


@exercise("5.3")
def test_greedy_keeps_the_longest_matching_prefix_then_the_targets_token(lab):
    """temperature 0: proposals matching the argmax up to position m give (m, argmax of row m), whatever
    follows the first mismatch, with or without q, for k = 1 to 8"""
    rng = random.Random(530)
    for k in (1, 2, 3, 5, 8):
        logits = randn(530 + k, k + 1, 50, scale=2)
        best = logits.argmax(-1).tolist()
        q = probs(540 + k, k, 50)
        for m in range(k + 1):
            wrong = (best[m] + rng.randint(1, 49)) % 50
            proposals = best[:m] + ([wrong] + best[m + 1:k] if m < k else [])  # later ones match again
            for q_given in (None, q):
                what = (f"verify at temperature 0 with k = {k}, proposals {proposals}, argmaxes {best}"
                        f"{'' if q_given is None else ', q given'}")
                got = as_pair(lab.verify(logits, proposals, q_given, 0.0, rng.choice([0, 5]), rng.choice([1.0, 0.8]),
                                         torch.Generator().manual_seed(k)), what)
                assert got == (m, best[m]), f"{what}: returns {got}, expected {(m, best[m])}"


@exercise("5.3")
def test_greedy_all_accepted_adds_the_bonus_token(lab):
    """temperature 0: k proposals that all match give (k, the argmax of row k)"""
    for k in (1, 3, 8):
        logits = randn(537 + k, k + 1, 40, scale=2)
        best = logits.argmax(-1).tolist()
        what = f"verify at temperature 0, all {k} proposals the target's argmaxes {best[:k]}"
        got = as_pair(lab.verify(logits, best[:k], None, 0.0, 0, 1.0, torch.Generator()), what)
        assert got == (k, best[k]), f"{what}: returns {got}, expected {(k, best[k])} (the bonus token of row {k})"


def one_hot_target(seed: int, k: int, vocab: int) -> tuple[torch.Tensor, list[int]]:
    """Logits whose top-1 filtered distributions are one-hot at each row's argmax: sampling with
    top_k = 1 is then certain, and so is every accept and reject decision."""
    logits = randn(seed, k + 1, vocab, scale=2)
    return logits, logits.argmax(-1).tolist()


@exercise("5.3")
def test_sampling_stops_at_the_first_rejection(lab):
    """sampled with top_k = 1 (a certain target): proposals kept up to the first one the target excludes,
    then the target's token of that row, for k = 1 and 8 and rejections first, midway and last"""
    for k, j in ((1, 0), (8, 0), (8, 3), (8, 7)):
        logits, best = one_hot_target(5300 + 10 * k + j, k, 30)
        proposals = best[:k]
        proposals[j] = (best[j] + 7) % 30  # excluded by top-k: rejected for sure
        certain = F.one_hot(torch.tensor(proposals), 30).float()
        for label, q in (("q None", None), ("q one-hot at the proposals", certain)):
            for seed in range(3):
                what = f"verify sampled, top_k 1, k = {k}, proposal {j} the target excludes, {label}"
                got = as_pair(lab.verify(logits, proposals, q, 1.0, 1, 1.0, torch.Generator().manual_seed(seed)), what)
                assert got == (j, best[j]), f"{what}: returns {got}, expected {(j, best[j])}"


@exercise("5.3")
def test_sampling_all_accepted_draws_the_bonus_token_from_the_last_row(lab):
    """sampled, proposals the target wants more than the proposer: all k kept, and the bonus token is
    distributed as p of row k (chi-square over 3000 draws; and with a certain target, row k's token)"""
    for k in (1, 8):
        logits, best = one_hot_target(5380 + k, k, 30)
        what = f"verify sampled, top_k 1, all {k} proposals the target's own tokens"
        got = as_pair(lab.verify(logits, best[:k], None, 1.0, 1, 1.0, torch.Generator()), what)
        assert got == (k, best[k]), f"{what}: returns {got}, expected {(k, best[k])} (the bonus token of row {k})"
    for temperature, top_k, top_p in PARAMS:
        k = 3
        logits = randn(5390, k + 1, 6, scale=1.2)
        p = target_probs(logits, temperature, top_k, top_p)  # [k + 1, 6]
        support = (p[:k] > 0).float()
        q = 0.5 * p[:k] + 0.5 * support / support.sum(-1, keepdim=True)  # below p at each row's argmax
        proposals = p[:k].argmax(-1).tolist()
        gen, tokens = torch.Generator().manual_seed(5391), []
        what = f"verify sampled (temperature {temperature}, top_k {top_k}, top_p {top_p}), k = {k}, q(x) < p(x)"
        with one_thread():
            for _ in range(3000):
                accepted, token = as_pair(lab.verify(logits, proposals, q, temperature, top_k, top_p, gen), what)
                assert accepted == k, \
                    f"{what}: accepted {accepted} proposals; each has p(x) > q(x), so all {k} are kept"
                tokens.append(token)
        assert_distributed_as(counts_of(tokens, 6, what), p[k], f"{what}: the bonus token")


def counts_of(tokens: list[int], vocab: int, what: str) -> torch.Tensor:
    outside = [t for t in tokens if not 0 <= t < vocab]
    assert not outside, f"{what}: returned token ids {outside[:5]} outside the vocabulary of {vocab}"
    return torch.bincount(torch.tensor(tokens, dtype=torch.long), minlength=vocab).double()


def first_emitted(lab, logits, x: int, q, params, draws: int, seed: int, what: str) -> torch.Tensor:
    """Counts of the first token verify emits (the proposal x if kept, else its replacement), k = 1."""
    gen, tokens = torch.Generator().manual_seed(seed), []
    with one_thread():
        for _ in range(draws):
            accepted, token = as_pair(lab.verify(logits, [x], q, *params, gen), what)
            assert accepted in (0, 1), f"{what}: accepted {accepted} of 1 proposal"
            tokens.append(x if accepted else token)
    return counts_of(tokens, logits.shape[-1], what)


@exercise("5.3")
def test_sampling_emits_kept_proposals_and_residual_draws_in_the_right_proportions(lab):
    """sampled, one proposal x: the first emitted token is x as often as the acceptance rule keeps it, else a
    draw from the residual, for a random q, a q disjoint from p and q None, plain and with seeded temperature, top-k
    and top-p (chi-square over 2500 draws each)"""
    for params in PARAMS:
        logits = randn(5310, 2, 6, scale=1.2)
        p = target_probs(logits, *params)[0]  # [6]
        for case in ("a random q", "q disjoint from p", "q None (a certain proposal)"):
            if case == "a random q":
                q = probs(5311, 6, scale=1.5)
                x = int((q - p).argmax())  # over-proposed: rejected part of the time
            elif case == "q disjoint from p":
                q = F.one_hot(p.argmin(), 6).float()
                x = int(p.argmin())
            else:
                q, x = None, int(p.argmax())
            q_row = F.one_hot(torch.tensor(x), 6).float() if q is None else q
            keep = min(1.0, float(p[x] / q_row[x]))
            rest = (p - q_row).clamp(min=0)
            expected = (1 - keep) * (rest / rest.sum() if rest.sum() > 0 else p)
            expected[x] += keep
            what = (f"verify sampled (temperature {params[0]}, top_k {params[1]}, top_p {params[2]}), proposal {x}, "
                    f"{case}")
            counts = first_emitted(lab, logits, x, None if q is None else q[None], params, 2500, 5312, what)
            assert_distributed_as(counts, expected, f"{what}: the first emitted token")


@exercise("5.3")
def test_sampled_output_is_distributed_as_the_target_position_by_position(lab):
    """proposals drawn from q, k = 2: the first emitted token follows p of row 0, the second (when the first
    was kept) p of row 1, and a proposal survives with probability sum min(p, q) (chi-square, 5000 draws),
    plain and with seeded temperature, top-k and top-p"""
    draws = 5000
    for params in PARAMS:
        logits = randn(5320, 3, 8, scale=1.3)
        p = target_probs(logits, *params)  # [3, 8]
        q = probs(5321, 2, 8, scale=1.5)
        alpha = torch.minimum(p[:2], q).sum(-1)  # [2]
        proposer = torch.Generator().manual_seed(5322)
        drawn = torch.multinomial(q, draws, replacement=True, generator=proposer)  # [2, draws]: all proposals at once
        gen, first, second, kept = torch.Generator().manual_seed(5323), [], [], []
        what = f"verify sampled (temperature {params[0]}, top_k {params[1]}, top_p {params[2]}), k = 2, x ~ q"
        with one_thread():
            for proposals in drawn.T.tolist():
                accepted, token = as_pair(lab.verify(logits, proposals, q, *params, gen), what)
                assert 0 <= accepted <= 2, f"{what}: accepted {accepted} of 2 proposals"
                emitted = proposals[:accepted] + [token]
                first.append(emitted[0])
                if accepted >= 1:
                    second.append(emitted[1])
                kept.append(accepted)
        assert_distributed_as(counts_of(first, 8, what), p[0], f"{what}: the first emitted token")
        assert_distributed_as(counts_of(second, 8, what), p[1], f"{what}: the second emitted token, after a kept first")
        expected = torch.stack([1 - alpha[0], alpha[0] * (1 - alpha[1]), alpha[0] * alpha[1]])
        assert_distributed_as(counts_of(kept, 3, what), expected, f"{what}: proposals kept (0, 1, 2)")


@exercise("5.3")
def test_verify_draws_from_the_generator_it_is_given(lab):
    """sampled: two generators of one seed give the same results; another seed gives others"""
    logits = randn(5330, 4, 10)
    q = probs(5331, 3, 10, scale=2)
    proposals = q.argmax(-1).tolist()

    def results(seed):
        gen = torch.Generator().manual_seed(seed)
        with one_thread():
            return [lab.verify(logits, proposals, q, 1.0, 0, 1.0, gen) for _ in range(40)]
    assert results(8) == results(8), "the same seed gave different results: randomness not from the generator"
    assert results(8) != results(9), "seeds 8 and 9 gave the same 40 results"


# -- 5.4 prompt lookup ---------------------------------------------------------------------------
def lookup(lab, token_ids: list[int], n: int, k: int) -> list[int]:
    got = lab.propose_ngram(list(token_ids), n, k)
    assert isinstance(got, (list, tuple)), \
        f"propose_ngram({token_ids}, n={n}, k={k}) returns {type(got).__name__}, not a list of token ids"
    return list(got)


def assert_proposes(lab, token_ids: list[int], n: int, k: int, expected: list[int], why: str) -> None:
    got = lookup(lab, token_ids, n, k)
    assert got == expected, f"propose_ngram({token_ids}, n={n}, k={k}) proposes {got}, expected {expected}: {why}"


@exercise("5.4")
def test_prompt_lookup_matches_minillm_on_random_histories(lab):
    """600 seeded random histories over small alphabets (lengths 0 to 40, n 1 to 4, k 1 to 8): minillm's proposals"""
    rng = random.Random(540)
    for case in range(600):
        alphabet = rng.randint(2, 7)
        token_ids = [rng.randrange(alphabet) * 3 + 1 for _ in range(rng.choice([0, 1, 2, 3, rng.randint(4, 40)]))]
        n, k = rng.randint(1, 4), rng.randint(1, 8)
        assert_proposes(lab, token_ids, n, k, reference_propose_ngram(token_ids, n, k), f"random history {case}")


@exercise("5.4")
def test_prompt_lookup_uses_the_latest_earlier_occurrence(lab):
    """of several earlier occurrences of the last n tokens, the latest decides"""
    assert_proposes(lab, [5, 6, 7, 8, 1, 5, 6, 7, 9, 2, 5, 6, 7], 3, 2, [9, 2], "[5, 6, 7] last occurred before 9, 2")
    rng = random.Random(541)
    for case in range(20):
        tail = [rng.randint(100, 110) for _ in range(3)]
        early, late = [rng.randint(200, 210) for _ in range(4)], [rng.randint(300, 310) for _ in range(4)]
        history = [1, 2] + tail + early + [3] + tail + late + [4] + tail
        assert_proposes(lab, history, 3, 4, late, f"case {case}: the tail occurs twice before, last followed by {late}")


@exercise("5.4")
def test_prompt_lookup_stops_at_the_end_of_the_history(lab):
    """a match near the end proposes only the tokens there are, fewer than k (overlapping the tail too)"""
    assert_proposes(lab, [1, 2, 3, 1, 2], 2, 5, [3, 1, 2], "only three tokens follow the earlier [1, 2]")
    assert_proposes(lab, [7, 7, 7, 7], 2, 4, [7], "the latest earlier [7, 7] starts at 1: one token follows it")
    assert_proposes(lab, [4, 9, 4, 9, 4], 3, 8, [9, 4], "[4, 9, 4] first occurred at 0, followed by 9, 4")
    assert_proposes(lab, [3, 5, 3], 1, 6, [5, 3], "[3] at 0 is followed by 5 and 3, then the history ends")


@exercise("5.4")
def test_prompt_lookup_finds_occurrences_at_both_ends_of_the_search(lab):
    """the earliest possible start (position 0) and the latest (one before the tail, overlapping it) both count"""
    assert_proposes(lab, [3, 8, 5, 1, 2, 4, 3, 8], 2, 3, [5, 1, 2], "[3, 8] occurred only at position 0")
    assert_proposes(lab, [6, 4, 2, 9, 9, 1, 6], 3, 2, [4, 2], "only [6] occurred before, at position 0")
    assert_proposes(lab, [2, 5, 5, 5], 2, 3, [5], "[5, 5] starts at 1, one before the tail; one token follows")
    assert_proposes(lab, [1, 9, 9], 4, 2, [9], "only [9] occurred before, right before the tail")


@exercise("5.4")
def test_prompt_lookup_without_any_match_proposes_nothing(lab):
    """no earlier occurrence of even the last token, or a history too short, gives []"""
    for token_ids, n in (([1, 2, 3, 4, 5], 3), ([9], 2), ([], 3), ([6, 8], 1)):
        assert_proposes(lab, token_ids, n, 4, [], "the last token never occurred before")


@exercise("5.4")
def test_prompt_lookup_falls_back_to_shorter_ngrams(lab):
    """the last n tokens never occurred before, so the last n - 1, ... down to one token are tried"""
    assert_proposes(lab, [4, 1, 9, 8, 4], 3, 2, [1, 9], "only [4] occurred before")
    assert_proposes(lab, [2, 5, 6, 1, 3, 5, 6], 4, 3, [1, 3, 5], "only [5, 6] occurred before")
    assert_proposes(lab, [1, 2, 3], 5, 2, [], "n is longer than the history, and nothing repeats")
    assert_proposes(lab, [8, 1, 2, 8], 6, 2, [1, 2], "n is longer than the history; [8] occurred before")


@exercise("5.4")
def test_prompt_lookup_prefers_the_longest_ngram_to_a_later_short_match(lab):
    """a match of the full n tokens wins over a later match of fewer"""
    assert_proposes(lab, [1, 2, 3, 40, 41, 9, 3, 50, 1, 2, 3], 3, 2, [40, 41],
                    "[1, 2, 3] occurred at 0 (followed by 40, 41); only [3] occurred later")
    assert_proposes(lab, [5, 6, 70, 8, 6, 80, 5, 6], 2, 1, [70], "[5, 6] occurred at 0; only [6] occurred later")


# -- 5.5 tokens per forward ------------------------------------------------------------------------
def series(alpha: float, k: int) -> float:
    """1 + alpha + ... + alpha^k, exactly (in rationals), then rounded once."""
    a = fractions.Fraction(alpha)
    return float(sum(a ** i for i in range(k + 1)))


def closed_form_tolerance(alpha: float, k: int) -> float:
    """How far a correct float64 answer may be from the exact sum, relative (eps = 2^-52). The closed form:
    1 - alpha^(k+1) is a difference of numbers near 1, off by a few ulps of 1, then divided by 1 - alpha;
    a sum of the k + 1 powers: a few ulps per term."""
    eps = 2.0 ** -52
    return (4 / (1 - alpha) if alpha < 1 else 0) * eps + 4 * (k + 1) * eps


def expected_tokens_of(lab, alpha: float, k: int) -> float:
    got = lab.expected_tokens_per_forward(alpha, k)
    assert isinstance(got, (int, float)) and not isinstance(got, bool), \
        f"expected_tokens_per_forward({alpha!r}, {k}) returns {type(got).__name__}, not a number"
    return float(got)


def assert_tokens_per_forward(lab, alpha: float, k: int, why: str = "") -> None:
    got, want = expected_tokens_of(lab, alpha, k), series(alpha, k)
    assert abs(got - want) <= closed_form_tolerance(alpha, k) * want, \
        f"expected_tokens_per_forward({alpha!r}, {k}) = {got!r}, expected {want!r}{why}"


@exercise("5.5")
def test_expected_tokens_per_forward_is_the_geometric_sum(lab):
    """the expected tokens per forward for seeded random acceptance rates and k = 1 to 8"""
    gen = torch.Generator().manual_seed(550)
    for alpha in [0.5, 0.8, 0.95, *torch.rand(20, generator=gen).tolist()]:
        for k in (1, 2, 4, 8):
            assert_tokens_per_forward(lab, alpha, k)


@exercise("5.5")
def test_expected_tokens_per_forward_at_the_ends(lab):
    """alpha = 0 (and -0.0) gives 1 token, alpha = 1 k + 1; k = 0 gives 1 whatever alpha; a very long k
    approaches the limit of the sum"""
    for k in (1, 3, 8, 37):
        for alpha, expected in ((0.0, 1.0), (-0.0, 1.0), (1.0, k + 1.0)):
            got = expected_tokens_of(lab, alpha, k)
            assert abs(got - expected) <= 4 * 2.0 ** -52 * expected, \
                f"expected_tokens_per_forward({alpha!r}, {k}) = {got!r}, expected {expected}"
    for alpha in (0.0, 0.3, 0.999, 1.0):
        got = expected_tokens_of(lab, alpha, 0)
        assert abs(got - 1.0) <= 1e-15, \
            f"expected_tokens_per_forward({alpha}, 0) = {got!r}: with no proposals a step emits its one token"
    for alpha in (0.5, 0.9):
        got = expected_tokens_of(lab, alpha, 2000)
        assert abs(got - 1 / (1 - alpha)) <= 1e-9, \
            (f"expected_tokens_per_forward({alpha}, 2000) = {got!r}; as k grows the sum approaches "
             f"{1 / (1 - alpha)}")


@exercise("5.5")
def test_expected_tokens_per_forward_as_alpha_approaches_one(lab):
    """alpha = 1 - 10^-e for e = 2 .. 15, seeded ones in between, and the float just below 1: the sum, within the
    closed form's own rounding (so that treating alpha near 1 as 1 fails wherever that moves the answer)"""
    rng = random.Random(555)
    alphas = [1 - 10.0 ** -e for e in range(2, 16)] + [1 - 10 ** -rng.uniform(2, 12) for _ in range(12)]
    alphas.append(math.nextafter(1.0, 0.0))
    for alpha in alphas:
        for k in (1, 4, 8, 31):
            assert_tokens_per_forward(lab, alpha, k, f" (1 - alpha = {1 - alpha:.3g})")


@exercise("5.5")
def test_expected_tokens_per_forward_refuses_an_alpha_outside_zero_one(lab):
    """alpha below 0 or above 1, by a lot or by the smallest step, NaN and infinities raise ValueError"""
    outside = (-0.01, 1.01, -1.0, 2.0, math.nextafter(1.0, 2.0), math.nextafter(0.0, -1.0), -1e-300,
               math.nan, math.inf, -math.inf)
    for alpha in outside:
        try:
            got = lab.expected_tokens_per_forward(alpha, 4)
        except ValueError:
            continue
        raise AssertionError(f"expected_tokens_per_forward({alpha!r}, 4) returned {got!r} instead of raising "
                             f"ValueError")


# -- 5.6 the distillation loss -------------------------------------------------------------------
def kl_div_reference(student: torch.Tensor, teacher: torch.Tensor, t: float) -> torch.Tensor:
    """PyTorch's kl_div, summed over everything and divided by the tokens, times t^2."""
    tokens = student.numel() // student.shape[-1]
    kl = F.kl_div(F.log_softmax(student.double() / t, -1), F.log_softmax(teacher.double() / t, -1),
                  log_target=True, reduction="sum")
    return kl / tokens * t * t


def loss_of(lab, student, teacher, t: float, what: str) -> torch.Tensor:
    got = lab.distill_loss(student, teacher, t)
    assert isinstance(got, torch.Tensor) and got.dim() == 0, \
        f"{what}: returns {type(got).__name__} of shape {tuple(getattr(got, 'shape', ()))}, not a 0-d tensor"
    return got


@exercise("5.6")
def test_distill_loss_matches_pytorch_kl_div(lab):
    """seeded random logits of shapes [29] (one token), [7, 33], [2, 5, 40] and [3, 1, 4, 17], temperatures 0.5 to 4
    and seeded ones between 0.3 and 6"""
    rng = random.Random(560)
    for seed, shape in enumerate(((29,), (7, 33), (2, 5, 40), (3, 1, 4, 17))):
        student, teacher = randn(560 + seed, *shape, scale=2), randn(570 + seed, *shape, scale=3)
        for t in (1.0, 0.5, 2.0, 4.0, round(rng.uniform(0.3, 0.9), 3), round(rng.uniform(1.2, 6.0), 3)):
            what = f"distill_loss on {list(shape)} logits, temperature {t}"
            with one_thread():
                got = loss_of(lab, student, teacher, t, what)
            assert_close(got.double(), kl_div_reference(student, teacher, t), what, atol=1e-5)


@exercise("5.6")
def test_distill_loss_is_the_kl_from_the_teacher_to_the_student(lab):
    """KL(teacher || student), not the reverse: a peaked teacher and a flat student, at temperature 1"""
    teacher = torch.tensor([[6.0, 0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 5.0, 0.0, 1.0]])
    student = torch.tensor([[0.5, 0.0, 0.1, 0.0, 0.2], [0.0, 0.3, 0.0, 0.1, 0.0]])
    p, log_p, log_q = teacher.softmax(-1), teacher.log_softmax(-1), student.log_softmax(-1)
    expected = (p * (log_p - log_q)).sum(-1).mean()
    reverse = (log_q.exp() * (log_q - log_p)).sum(-1).mean()
    got = loss_of(lab, student, teacher, 1.0, "distill_loss, peaked teacher")
    assert abs(float(got) - float(expected)) < 1e-4, \
        (f"distill_loss = {float(got):.4f}; KL(teacher || student) = {float(expected):.4f} "
         f"(KL(student || teacher) = {float(reverse):.4f})")


@exercise("5.6")
def test_distill_loss_is_scaled_by_the_temperature_squared(lab):
    """loss(T) = T^2 x the KL of the softened distributions, for T = 2 and 3"""
    student, teacher = randn(580, 6, 21, scale=2), randn(581, 6, 21, scale=4)
    for t in (2.0, 3.0):
        kl = kl_div_reference(student / t, teacher / t, 1.0)
        got = loss_of(lab, student, teacher, t, f"distill_loss at temperature {t}")
        assert abs(float(got) - t * t * float(kl)) < 1e-4, \
            (f"distill_loss at temperature {t} = {float(got):.5f}; the KL of the softened distributions is "
             f"{float(kl):.5f}, times T^2 = {t * t * float(kl):.5f}")


@exercise("5.6")
def test_distill_loss_sums_over_the_vocabulary_and_averages_over_tokens(lab):
    """the same token repeated gives the same loss as once; reshaping the tokens changes nothing"""
    student, teacher = randn(590, 1, 25, scale=2), randn(591, 1, 25, scale=2)
    one = float(loss_of(lab, student, teacher, 1.0, "distill_loss of one token"))
    expected = float(kl_div_reference(student, teacher, 1.0))
    assert abs(one - expected) < 1e-4, \
        f"distill_loss of one token = {one:.5f}, its KL summed over the vocabulary is {expected:.5f}"
    many = float(loss_of(lab, student.expand(12, 25), teacher.expand(12, 25), 1.0, "distill_loss of 12 copies"))
    assert abs(many - one) < 1e-4, f"12 copies of one token give {many:.5f}, the token alone {one:.5f}"
    s, t = randn(592, 12, 25), randn(593, 12, 25)
    flat = float(loss_of(lab, s, t, 1.0, "distill_loss on [12, 25]"))
    shaped = float(loss_of(lab, s.reshape(3, 4, 25), t.reshape(3, 4, 25), 1.0, "distill_loss on [3, 4, 25]"))
    assert abs(flat - shaped) < 1e-5, f"the same 12 tokens as [12, 25] give {flat:.5f}, as [3, 4, 25] {shaped:.5f}"


@exercise("5.6")
def test_distill_loss_with_probabilities_that_underflow(lab):
    """logits spread over hundreds (a confident model): many probabilities are 0 in float32, yet the loss is finite
    and equals the float64 KL (log-probabilities never go through a log of 0)"""
    for seed, scale in ((596, 40.0), (597, 90.0)):
        student, teacher = randn(seed, 4, 50, scale=scale), randn(seed + 10, 4, 50, scale=scale)
        assert (F.softmax(teacher, -1) == 0).any(), "grader data: the teacher's probabilities should underflow"
        for t in (1.0, 1.7):
            what = f"distill_loss on logits of scale {scale:g}, temperature {t}"
            got = loss_of(lab, student, teacher, t, what)
            assert_close(got.double(), kl_div_reference(student, teacher, t), what, atol=1e-3, rtol=1e-4)


@exercise("5.6")
def test_distill_loss_of_bfloat16_logits_is_computed_in_float32(lab):
    """bfloat16 logits (how a model run in bfloat16 hands them over): a float32 result equal to the KL of those very
    values computed in float64, to 1e-5; a loss computed in bfloat16 itself is off by about 1e-2 of itself"""
    for seed, shape in ((598, (6, 40)), (599, (2, 3, 64))):
        student = randn(seed, *shape, scale=2).bfloat16()
        teacher = randn(seed + 10, *shape, scale=3).bfloat16()
        for t in (1.0, 2.0):
            what = f"distill_loss on bfloat16 logits {list(shape)}, temperature {t}"
            got = loss_of(lab, student, teacher, t, what)
            assert got.dtype == torch.float32, f"{what}: the loss is {got.dtype}, not float32"
            assert_close(got.double(), kl_div_reference(student, teacher, t), what, atol=1e-5, rtol=1e-5)


@exercise("5.6")
def test_distill_loss_trains_the_student(lab):
    """the loss keeps its gradient, and it is the gradient of the loss the contract defines (against its closed
    form)"""
    for t in (1.0, 2.5):
        student = randn(594, 5, 13, scale=2).requires_grad_()
        teacher = randn(595, 5, 13, scale=2)
        got = loss_of(lab, student, teacher, t, f"distill_loss at temperature {t}")
        assert got.requires_grad, \
            f"distill_loss at temperature {t} has no gradient with respect to the student's logits"
        got.backward()
        expected = t * ((student.detach() / t).softmax(-1) - (teacher / t).softmax(-1)) / 5
        assert_close(student.grad, expected, f"the gradient of distill_loss at temperature {t}", atol=1e-5)


# -- 5.7 the heads' proposal ---------------------------------------------------------------------
def seeded_heads(seed: int, hidden: int, vocab: int, num_heads: int, dtype=torch.float32):
    """(blocks, lm_head) with seeded weights far from the identity, so each head guesses its own token."""
    gen = torch.Generator().manual_seed(seed)
    heads = SpecHeads(hidden, num_heads)
    lm_head = torch.nn.Linear(hidden, vocab, bias=False)
    with torch.no_grad():
        for block in heads.blocks:
            block.weight.copy_(torch.randn(hidden, hidden, generator=gen) / hidden ** 0.5 * 2)
            block.bias.copy_(torch.randn(hidden, generator=gen))
        lm_head.weight.copy_(torch.randn(vocab, hidden, generator=gen))
    return heads.blocks.to(dtype), lm_head.to(dtype)


def heads_proposal_of(lab, hidden, blocks, lm_head, k: int, what: str) -> list[list[int]]:
    with torch.inference_mode():
        got = lab.propose_heads(hidden, blocks, lm_head, k)
    assert isinstance(got, list) and all(isinstance(row, list) for row in got), \
        f"{what}: returns {type(got).__name__}, not a list of one list per sequence"
    assert all(type(t) is int for row in got for t in row), f"{what}: the token ids are not Python ints: {got}"
    return got


@exercise("5.7")
def test_heads_proposal_matches_minillm_on_seeded_heads(lab):
    """seeded heads, LM heads and hidden states: hidden sizes 8 to 48, vocabularies 11 to 300, 1 to 6 heads,
    batches of 1 to 5 and every k up to the number of heads: the engine's proposals"""
    rng = random.Random(570)
    for case in range(10):
        hidden_size, vocab, num_heads, batch = rng.randint(8, 48), rng.randint(11, 300), rng.randint(1, 6), \
            rng.randint(1, 5)
        blocks, lm_head = seeded_heads(5700 + case, hidden_size, vocab, num_heads)
        hidden = randn(5710 + case, batch, hidden_size, scale=2)
        for k in range(1, num_heads + 1):
            what = (f"propose_heads on {batch} sequences, hidden size {hidden_size}, {num_heads} heads, vocab {vocab}, "
                    f"k = {k}")
            expected = reference_propose_heads(hidden, blocks, lm_head, k)
            got = heads_proposal_of(lab, hidden, blocks, lm_head, k, what)
            assert got == expected, f"{what}: proposed {got}; the engine's heads propose {expected}"


@exercise("5.7")
def test_heads_proposal_at_the_edges(lab):
    """k = 0 (an empty list per sequence), no sequences, bfloat16 heads and hidden states, heads still at their
    identity start (each guesses the LM head's own token); hidden and the modules left unchanged"""
    blocks, lm_head = seeded_heads(5720, 16, 40, 3)
    hidden = randn(5721, 4, 16, scale=2)
    before = hidden.clone(), [b.weight.clone() for b in blocks], lm_head.weight.clone()
    got = heads_proposal_of(lab, hidden, blocks, lm_head, 0, "propose_heads with k = 0")
    assert got == [[], [], [], []], f"propose_heads with k = 0 on 4 sequences returned {got}, not 4 empty lists"
    got = heads_proposal_of(lab, hidden[:0], blocks, lm_head, 2, "propose_heads on no sequences")
    assert got == [], f"propose_heads on a [0, 16] hidden returned {got}, not an empty list"
    heads_proposal_of(lab, hidden, blocks, lm_head, 3, "propose_heads with k = all 3 heads")
    assert torch.equal(hidden, before[0]), "propose_heads changed the hidden states it was given"
    unchanged = all(torch.equal(b.weight, w) for b, w in zip(blocks, before[1]))
    assert unchanged and torch.equal(lm_head.weight, before[2]), \
        "propose_heads changed the heads' or the LM head's weights"
    blocks16, lm_head16 = seeded_heads(5722, 24, 64, 4, dtype=torch.bfloat16)
    hidden16 = randn(5723, 3, 24, scale=2).bfloat16()
    what = "propose_heads on bfloat16 hidden states and heads, k = 4"
    expected = reference_propose_heads(hidden16, blocks16, lm_head16, 4)
    assert heads_proposal_of(lab, hidden16, blocks16, lm_head16, 4, what) == expected, \
        f"{what}: not the engine's proposals {expected}"
    fresh = SpecHeads(16, 3).blocks  # zero weights and biases: every head guesses what the LM head does
    own = lm_head(hidden).argmax(-1).tolist()
    got = heads_proposal_of(lab, hidden, fresh, lm_head, 3, "propose_heads with heads at their identity start")
    assert got == [[t] * 3 for t in own], \
        (f"propose_heads with heads of zero weights proposed {got}; each head adds nothing to the hidden state then, "
         f"so each should guess the LM head's own token {own}")


@exercise("5.7")
def test_heads_proposal_refuses_a_k_the_heads_cannot_give(lab):
    """k above the number of heads, or below 0: ValueError"""
    blocks, lm_head = seeded_heads(5730, 8, 20, 3)
    for k in (4, 9, -1):
        try:
            with torch.inference_mode():
                got = lab.propose_heads(randn(5731, 2, 8), blocks, lm_head, k)
        except ValueError:
            continue
        raise AssertionError(f"propose_heads with 3 heads and k = {k} returned {got!r} instead of raising ValueError")


def tiny_heads_file(folder: Path) -> Path:
    """tiny's bundled heads, or (when they were not trained) seeded ones fitted to nothing, saved in folder."""
    bundled = BUNDLED_DIR / "tiny" / HEADS_FILE
    if bundled.is_file():
        return bundled
    target = LLM("tiny").model
    heads = SpecHeads(target.config.hidden_size, 4)
    for block in heads.blocks:
        torch.nn.init.normal_(block.weight, std=0.05, generator=torch.Generator().manual_seed(574))
    save_heads(heads, target, folder / HEADS_FILE)
    return folder / HEADS_FILE


def heads_run(spec: SpeculativeConfig, propose=None) -> tuple[list[list[int]], list[tuple[int, int]]]:
    """Greedy code-like prompts through tiny with the heads proposing: tokens and (proposed, accepted) per request."""
    gen = torch.Generator().manual_seed(575)
    prompts = [torch.randint(1, 4096, (4 + 3 * i,), generator=gen).tolist() for i in range(4)]
    llm = LLM("tiny", speculative=spec, components=Components(propose_heads=propose))
    outs = llm.generate(prompts, SamplingParams(max_tokens=16, temperature=0, ignore_eos=True), use_tqdm=False)
    return [o.token_ids for o in outs], [(o.metrics["spec_proposed"], o.metrics["spec_accepted"]) for o in outs]


@exercise("5.7", timeout=180)
def test_your_heads_proposal_runs_the_real_engine(lab):
    """the real engine (tiny, its heads, k = 4, greedy) with your heads proposal: the reference engine's tokens,
    and the same proposals proposed and accepted per request"""
    calls = []

    def yours(*args):
        calls.append(1)
        try:
            return lab.propose_heads(*args)
        except Exception as e:
            raise AssertionError(f"Exercise 5.7 (propose_heads) raised inside the engine: {type(e).__name__}: {e}") \
                from e

    with tempfile.TemporaryDirectory() as folder, one_thread():  # check() in a notebook has no pytest fixtures
        spec = SpeculativeConfig("heads", k=4, heads=str(tiny_heads_file(Path(folder))))
        reference = heads_run(spec)
        mine = heads_run(spec, yours)
    assert calls, "the engine never called your propose_heads"
    assert mine[0] == reference[0], "with your heads proposal the engine's greedy tokens differ from its own"
    assert mine[1] == reference[1], \
        (f"with your heads proposal the engine proposed and accepted (per request) {mine[1]}; with its own "
         f"{reference[1]}")


# -- 5.E the verifier and prompt lookup inside the engine -----------------------------------------
SPEC = SpeculativeConfig("ngram", k=3)


def speculation_counts(components: Components | None) -> list[tuple[int, int]]:
    """(proposed, accepted) per request: prompts that repeat pieces of themselves, greedy, on pico."""
    gen = torch.Generator().manual_seed(505)
    prompts = []
    for i in range(5):
        piece = torch.randint(1, 4096, (5 + i,), generator=gen).tolist()
        prompts.append(torch.randint(1, 4096, (3,), generator=gen).tolist() + piece * 2 + piece[:2])
    llm = LLM(MODEL, speculative=SPEC, components=components or Components())
    outs = llm.generate(prompts, SamplingParams(max_tokens=20, temperature=0, ignore_eos=True), use_tqdm=False)
    return [(o.metrics["spec_proposed"], o.metrics["spec_accepted"]) for o in outs]


@exercise("5.E", timeout=180)
def test_your_verifier_and_prompt_lookup_run_the_real_engine(lab):
    ("the real engine with your verifier and prompt lookup (k = 3, greedy) gives the reference engine's tokens, "
     "proposes and keeps what it does, and leaks no block")
    # the heads' proposal (5.7) runs with method "heads" only: its own engine test grades it
    components = dataclasses.replace(lab_components(lab, labs=["05"]), propose_heads=None)
    with one_thread():  # pico's small steps: more threads only wait on a busy machine
        check_against_reference(components, speculative=SPEC)
        reference = speculation_counts(None)
        assert sum(a for _, a in reference), "the speculation workload no longer has any proposal accepted"
        mine = speculation_counts(components)
    assert mine == reference, (f"with your parts the engine proposed and accepted (per request) {mine}; with its own "
                               f"{reference}")
