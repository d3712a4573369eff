"""Grader of lab 06, quantization.

Oracles: minillm's codecs and quantized linear layer (minillm/quant/codecs.py, linear.py), whose
formulas the exercises state, checked bit for bit where the contract fixes every rounding; fixed
cases computed by hand (ties at .5, weights exactly halfway after the division, one-signed and constant
groups, nibble order); the round-trip
bound |w - dequant(w)| <= scale / 2; minillm's own sensitivity sweep (minillm/experiments/quant_sensitivity.py);
a brute-force search written here for the cancelling pairs; and for 6.E the real engine with the
notebook's codecs against the engine with its own.
"""
import copy
import itertools
import math
import random
from dataclasses import replace
from functools import cache

import pytest
import torch

from minillm import LLM
from minillm.config import Components
from minillm.experiments.quant_quality import Quality, Reference
from minillm.experiments.quant_sensitivity import layer_sensitivity as reference_layer_sensitivity
from minillm.labkit import exercise
from minillm.labkit.endtoend import check_against_reference
from minillm.labkit.fixtures import assert_close, one_thread, randn
from minillm.labkit.plug import lab_components
from minillm.quant import QuantConfig, QuantizedLinear, codecs
from minillm.quant.quantized_linear import int4_linear as reference_int4_linear

EXERCISES = {"6.1": "quantize_int8", "6.2": "quantize_int4", "6.3": "pack_int4", "6.4": "unpack_int4",
             "6.5": "int4_linear", "6.6": "layer_sensitivity", "6.7": "find_cancellations",
             "6.E": "your codecs and int4 layer in the real engine"}

SHAPES = [(7, 192), (33, 64), (128, 256), (5, 384), (3, 96)]  # out != in, odd row counts, several groups a row


def weights(seed: int, out_features: int, in_features: int) -> torch.Tensor:
    """Normal weights of both signs, with rows of very different sizes, one row all positive and one all negative."""
    w = randn(seed, out_features, in_features) * (0.5 + randn(seed + 1, out_features, 1).abs())
    if out_features > 2:
        w[1] = w[1].abs()
        w[2] = -w[2].abs()
    return w


# -- 6.1 int8 ----------------------------------------------------------------------------------
def int8_of(lab, w: torch.Tensor, what: str) -> tuple[torch.Tensor, torch.Tensor]:
    result = lab.quantize_int8(w.clone())
    assert isinstance(result, tuple) and len(result) == 2, f"{what}: quantize_int8 must return (q, scale)"
    q, scale = result
    assert isinstance(q, torch.Tensor) and q.dtype == torch.int8, f"{what}: q must be an int8 tensor"
    assert q.shape == w.shape, f"{what}: q has shape {tuple(q.shape)}, expected {tuple(w.shape)}"
    assert isinstance(scale, torch.Tensor) and scale.dtype == torch.float32 and scale.shape == (w.shape[0],), \
        f"{what}: scale must be float32 of shape [out] = {(w.shape[0],)}, got {getattr(scale, 'dtype', None)} " \
        f"{tuple(getattr(scale, 'shape', ()))}"
    return q, scale


@exercise("6.1")
def test_int8_equals_minillm_on_random_matrices(lab):
    """q and scale equal minillm's quantize_int8 bit for bit (seeded matrices of both signs, out != in)"""
    for seed, (out_features, in_features) in enumerate(SHAPES):
        w = weights(610 + seed, out_features, in_features)
        what = f"quantize_int8 of a {out_features} x {in_features} matrix (seed {610 + seed})"
        q, scale = int8_of(lab, w, what)
        want_q, want_scale = codecs.quantize_int8(w)
        assert_close(scale, want_scale, f"{what}: scale", atol=0, rtol=1e-6)
        wrong = int((q != want_q).sum())
        assert not wrong, f"{what}: {wrong} of {q.numel()} codes differ from the formula's"


@exercise("6.1")
def test_int8_round_trip_is_within_half_a_step_and_uses_the_full_range(lab):
    """|w - q * scale| <= scale / 2 for every weight, and each row's largest |w| lands on +-127"""
    for seed in range(3):
        w = weights(615 + seed, 16, 80) * 10 ** (seed - 1)
        what = f"quantize_int8 of a 16 x 80 matrix (seed {615 + seed})"
        q, scale = int8_of(lab, w, what)
        err = (w - q.float() * scale[:, None]).abs()
        worst = float((err / scale[:, None]).max())
        assert worst <= 0.5 * (1 + 1e-5), f"{what}: a weight comes back {worst:.3f} steps off; at most 0.5 allowed"
        peaks = q.abs().amax(dim=1)
        assert (peaks == 127).all(), \
            f"{what}: the largest |q| of each row should be 127, got {sorted(set(peaks.tolist()))}"


@exercise("6.1")
def test_int8_rounds_halves_to_even(lab):
    """a row whose largest |w| is 127 (scale 1): 2.5 -> 2, -3.5 -> -4, 0.5 -> 0, 1.5 -> 2, 126.5 -> 126"""
    w = torch.tensor([[127.0, 2.5, -3.5, 0.5, -0.5, 1.5, 126.5, -126.5]])
    q, scale = int8_of(lab, w, "quantize_int8 of a row with exact halves")
    assert_close(scale, torch.tensor([1.0]), "quantize_int8 of a row whose largest |w| is 127: scale",
                 atol=0, rtol=1e-7)
    want = [127, 2, -4, 0, 0, 2, 126, -126]
    assert q[0].tolist() == want, f"quantize_int8 of {w[0].tolist()} gave {q[0].tolist()}, expected {want}"


def exact_halves(seed: int, rows: int) -> torch.Tensor:
    """Rows whose weights sit exactly halfway between two codes: w / scale, divided in float32, is k + 0.5.
    Each row holds its largest |w| (which fixes the scale) and every half-step from -126.5 to 125.5 that the
    division lands on exactly. There the quotient decides the code: a product with a rounded reciprocal of the
    scale instead of the quotient lands a hair off the half and rounds to the other neighbour."""
    rng = random.Random(seed)
    halves = torch.arange(-126, 126, dtype=torch.float32) + 0.5          # [252]
    out = []
    for _ in range(rows):
        peak = torch.tensor([rng.uniform(0.01, 3.0)], dtype=torch.float32)
        scale = (peak / codecs.INT8_MAX).clamp_min(codecs.TINY)
        w = halves * scale                                                # [252], each a float32
        w = w[w / scale == halves]                                        # only the exact halves
        out.append(torch.cat([peak, w[: len(halves) // 2], -peak, w[len(halves) // 2:]]))
    width = min(len(r) for r in out)
    return torch.stack([r[:width] for r in out])


@exercise("6.1")
def test_int8_codes_at_exact_halves_equal_minillm(lab):
    """weights exactly halfway between two codes (w / scale in float32 is k + 0.5, for many scales): the codes equal
    minillm's bit for bit, each the even neighbour of the quotient"""
    w = exact_halves(611, 24)
    what = f"quantize_int8 of {w.shape[0]} rows of weights exactly halfway between two codes"
    q, scale = int8_of(lab, w, what)
    want_q, want_scale = codecs.quantize_int8(w)
    assert_close(scale, want_scale, f"{what}: scale", atol=0, rtol=0)
    bad = (q != want_q).nonzero().tolist()
    if bad:
        r, c = bad[0]
        raise AssertionError(f"{what}: {len(bad)} of {q.numel()} codes differ from minillm's, e.g. w = "
                             f"{float(w[r, c]):.9g} with scale {float(scale[r]):.9g} (w / scale = "
                             f"{float(w[r, c] / scale[r]):.9g} in float32) gave {int(q[r, c])}, expected "
                             f"{int(want_q[r, c])}")


def small_rows(seed: int, out_features: int, in_features: int) -> torch.Tensor:
    """Rows whose largest |w| runs from 1e-5 down past float32's smallest normal (subnormal rows included),
    one exactly 127 * TINY (a scale of exactly TINY): there a floor of one's own (1e-8, 1e-12, float32's eps)
    instead of TINY changes the scale, and so the codes."""
    rng = random.Random(seed)
    w = randn(seed, out_features, in_features)
    w = w / w.abs().amax(dim=1, keepdim=True)  # each row's largest |w| is 1
    sizes = [10.0 ** -rng.uniform(5, 37) for _ in range(out_features - 3)] + [127 * codecs.TINY, 3e-39, 1e-42]
    return w * torch.tensor(sizes).reshape(-1, 1)


@exercise("6.1")
def test_int8_equals_minillm_on_tiny_rows_and_odd_shapes(lab):
    """rows of tiny magnitude, down to subnormal ones (the scale's floor is TINY), and matrices of one row or one
    column: q and scale equal minillm's bit for bit"""
    cases = [("rows of magnitudes 1e-5 to 1e-42", small_rows(618, 12, 40)), ("a 1 x 1 matrix", randn(619, 1, 1)),
             ("a 1 x 77 matrix", randn(620, 1, 77)), ("a 45 x 1 matrix", randn(621, 45, 1))]
    for label, w in cases:
        what = f"quantize_int8 of {label}"
        q, scale = int8_of(lab, w, what)
        want_q, want_scale = codecs.quantize_int8(w)
        bad = (scale != want_scale).nonzero().flatten().tolist()
        assert not bad, (f"{what}: row {bad[0]} (largest |w| {float(w[bad[0]].abs().max()):.3g}) has scale "
                         f"{float(scale[bad[0]]):.4g}, expected {float(want_scale[bad[0]]):.4g} "
                         f"(max|w| / 127, at least TINY = {codecs.TINY:.4g})")
        wrong = int((q != want_q).sum())
        assert not wrong, f"{what}: {wrong} of {q.numel()} codes differ from the formula's"


@exercise("6.1")
def test_int8_row_of_zeros_gets_a_positive_scale_and_zero_codes(lab):
    """a row of zeros: a finite positive scale (at least TINY), codes 0, no NaN"""
    w = weights(617, 4, 32)
    w[1] = 0.0
    q, scale = int8_of(lab, w, "quantize_int8 of a matrix with a row of zeros")
    assert torch.isfinite(scale).all() and (scale > 0).all(), \
        f"quantize_int8 with a row of zeros: scales {scale.tolist()}; each must be finite and > 0 (TINY at least)"
    assert (q[1] == 0).all(), f"quantize_int8: a row of zeros gave codes {q[1].tolist()[:8]}..., expected zeros"


# -- 6.2 int4 ----------------------------------------------------------------------------------
def int4_of(lab, w: torch.Tensor, group_size: int, what: str):
    result = lab.quantize_int4(w.clone(), group_size)
    assert isinstance(result, tuple) and len(result) == 3, f"{what}: quantize_int4 must return (codes, scale, zero)"
    codes, scale, zero = result
    groups = (w.shape[0], w.shape[1] // group_size)
    assert isinstance(codes, torch.Tensor) and codes.dtype == torch.uint8 and codes.shape == w.shape, \
        f"{what}: codes must be uint8 of shape {tuple(w.shape)}, got {getattr(codes, 'dtype', None)} " \
        f"{tuple(getattr(codes, 'shape', ()))}"
    assert isinstance(scale, torch.Tensor) and scale.dtype == torch.float32 and scale.shape == groups, \
        f"{what}: scale must be float32 of shape [out, in // group_size] = {groups}, got " \
        f"{getattr(scale, 'dtype', None)} {tuple(getattr(scale, 'shape', ()))}"
    assert isinstance(zero, torch.Tensor) and zero.dtype == torch.uint8 and zero.shape == groups, \
        f"{what}: zero must be uint8 of shape {groups}, got {getattr(zero, 'dtype', None)} " \
        f"{tuple(getattr(zero, 'shape', ()))}"
    assert int(codes.max()) <= 15 and int(zero.max()) <= 15, \
        f"{what}: codes and zero points must lie in 0..15, got up to {int(codes.max())} and {int(zero.max())}"
    return codes, scale, zero


def dequantized(codes, scale, zero) -> torch.Tensor:
    return codecs.dequantize_int4(codes, scale, zero)


@exercise("6.2")
def test_int4_equals_minillm_on_random_matrices(lab):
    """codes, scales and zero points equal minillm's quantize_int4 (group sizes 32, 64, 128; one-signed rows)"""
    for seed, (out_features, in_features) in enumerate(SHAPES):
        for group_size in (32, 64, 128):
            if in_features % group_size:
                continue
            w = weights(620 + seed, out_features, in_features)
            what = (f"quantize_int4 of a {out_features} x {in_features} matrix, groups of {group_size} "
                    f"(seed {620 + seed})")
            codes, scale, zero = int4_of(lab, w, group_size, what)
            want_codes, want_scale, want_zero = codecs.quantize_int4(w, group_size)
            assert_close(scale, want_scale, f"{what}: scale", atol=0, rtol=1e-6)
            assert torch.equal(zero, want_zero), \
                f"{what}: {int((zero != want_zero).sum())} of {zero.numel()} zero points differ from the formula's"
            assert torch.equal(codes, want_codes), \
                f"{what}: {int((codes != want_codes).sum())} of {codes.numel()} codes differ from the formula's"


@exercise("6.2")
def test_int4_round_trip_is_within_half_a_step(lab):
    """|w - (codes - zero) * scale| <= scale / 2 for every weight of its group (seeded matrices)"""
    for seed, group_size in ((625, 16), (626, 32), (627, 96)):
        w = weights(seed, 9, 192) * 10 ** (seed % 3 - 1)
        what = f"quantize_int4 of a 9 x 192 matrix, groups of {group_size} (seed {seed})"
        codes, scale, zero = int4_of(lab, w, group_size, what)
        steps = (w - dequantized(codes, scale, zero)).abs() / scale.repeat_interleave(group_size, dim=1)
        worst = float(steps.max())
        assert worst <= 0.5 * (1 + 1e-5), f"{what}: a weight comes back {worst:.3f} steps off; at most 0.5 allowed"


@exercise("6.2")
def test_int4_one_signed_and_constant_groups(lab):
    """all-positive group: zero point 0; all-negative: 15; constant groups come back exact; a zero group stays 0"""
    g = 8
    w = torch.stack([torch.linspace(1.0, 2.0, g), torch.linspace(-3.0, -0.5, g), torch.full((g,), 0.7),
                     torch.full((g,), -1.3), torch.zeros(g), torch.linspace(-1.0, 0.0, g)]).reshape(1, -1)  # [1, 6 g]
    codes, scale, zero = int4_of(lab, w, g, "quantize_int4 of one-signed and constant groups")
    assert torch.isfinite(scale).all() and (scale > 0).all(), \
        f"quantize_int4: scales {scale[0].tolist()}; each must be finite and > 0 (a group of zeros: TINY)"
    assert zero[0, 0] == 0 and zero[0, 1] == 15, (f"quantize_int4: an all-positive group got zero point "
                                                  f"{int(zero[0, 0])}, an all-negative one {int(zero[0, 1])}; "
                                                  f"the range holds 0, so they are 0 and 15")
    back = dequantized(codes, scale, zero)
    labels = ["1.0 .. 2.0", "-3.0 .. -0.5", "all 0.7", "all -1.3", "all 0", "-1.0 .. 0.0"]
    for j, label in enumerate(labels):
        group, got, step = w[0, j * g:(j + 1) * g], back[0, j * g:(j + 1) * g], float(scale[0, j])
        worst = float((group - got).abs().max())
        exact = label.startswith("all")
        assert worst <= (1e-6 * float(group.abs().max()) if exact else step / 2 * (1 + 1e-5)), \
            (f"quantize_int4: the group {label} comes back as {[round(v, 4) for v in got.tolist()]}, off by up to "
             f"{worst:.4g}" + (" (a constant group is stored exactly)" if exact else f" (scale {step:.4g})"))


@exercise("6.2")
def test_int4_rounds_halves_to_even(lab):
    """the group -7.5 .. 7.5 (scale 1, zero point round(7.5) = 8): 0.5 -> 8, 1.5 and 2.5 -> 10, 7.5 -> 15 (clamped)"""
    w = torch.tensor([[-7.5, 7.5, 0.5, -0.5, 1.5, 2.5, -2.5, 0.0]])
    codes, scale, zero = int4_of(lab, w, 8, "quantize_int4 of a group with exact halves")
    assert_close(scale, torch.tensor([[1.0]]), "quantize_int4 of the group -7.5 .. 7.5: scale", atol=0, rtol=1e-7)
    assert int(zero[0, 0]) == 8, f"quantize_int4 of the group -7.5 .. 7.5: zero point {int(zero[0, 0])}, expected 8"
    want = [0, 15, 8, 8, 10, 10, 6, 8]
    assert codes[0].tolist() == want, \
        f"quantize_int4 of {w[0].tolist()} gave codes {codes[0].tolist()}, expected {want}"


@exercise("6.2")
def test_int4_equals_minillm_for_seeded_group_sizes(lab):
    """seeded group sizes far from the usual powers of two (1, 3, 5 to 40, a whole row), rows of tiny magnitude
    down to subnormal ones (the scale's floor is TINY): codes, scales and zero points equal minillm's"""
    rng = random.Random(629)
    sizes = [1, 3, rng.randint(5, 11), rng.randint(13, 27), rng.randint(29, 40)]
    for case, group_size in enumerate(sizes):
        groups = rng.randint(1, 6)
        for label, w in (("seeded weights", weights(6290 + case, rng.randint(2, 9), group_size * groups)),
                         ("rows of magnitudes 1e-5 to 1e-42", small_rows(6295 + case, 8, group_size * groups))):
            what = f"quantize_int4 of {label}, {w.shape[0]} x {w.shape[1]}, groups of {group_size}"
            codes, scale, zero = int4_of(lab, w, group_size, what)
            want_codes, want_scale, want_zero = codecs.quantize_int4(w, group_size)
            bad = (scale != want_scale).nonzero().tolist()
            assert not bad, (f"{what}: group {tuple(bad[0])} has scale {float(scale[tuple(bad[0])]):.4g}, expected "
                             f"{float(want_scale[tuple(bad[0])]):.4g} ((hi - lo) / 15, at least TINY)")
            assert torch.equal(zero, want_zero), \
                f"{what}: {int((zero != want_zero).sum())} of {zero.numel()} zero points differ from the formula's"
            assert torch.equal(codes, want_codes), \
                f"{what}: {int((codes != want_codes).sum())} of {codes.numel()} codes differ from the formula's"


@exercise("6.2")
def test_int4_stores_a_weight_of_zero_exactly(lab):
    """weights that are exactly 0 (pruned, padding) come back exactly 0: their code is the zero point"""
    for seed, group_size in ((6280, 16), (6281, 7)):
        w = weights(seed, 6, group_size * 5)
        w[torch.rand(w.shape, generator=torch.Generator().manual_seed(seed)) < 0.25] = 0.0
        what = f"quantize_int4 of a matrix with a quarter of its weights 0, groups of {group_size}"
        back = dequantized(*int4_of(lab, w, group_size, what))
        moved = int((back[w == 0] != 0).sum())
        assert not moved, f"{what}: {moved} of {int((w == 0).sum())} zero weights come back nonzero"


@exercise("6.2")
def test_int4_refuses_a_group_size_that_is_not_a_positive_divisor(lab):
    """a group size that leaves a partial group (64 or 192 for rows of 96 inputs), 0, or a negative one even where
    it divides (-32, -96) raises ValueError"""
    for group_size in (64, 192, 0, -32, -96, 7):
        with pytest.raises(ValueError):
            lab.quantize_int4(weights(628, 4, 96), group_size)


# -- 6.3 pack ----------------------------------------------------------------------------------
def random_codes(seed: int, *shape: int) -> torch.Tensor:
    return torch.randint(0, 16, shape, generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)


def packed_of(lab, codes: torch.Tensor, what: str) -> torch.Tensor:
    packed = lab.pack_int4(codes.clone())
    shape = (*codes.shape[:-1], (codes.shape[-1] + 1) // 2)
    assert isinstance(packed, torch.Tensor) and packed.dtype == torch.uint8 and packed.shape == shape, \
        f"{what}: pack_int4 must return uint8 of shape {shape}, got {getattr(packed, 'dtype', None)} " \
        f"{tuple(getattr(packed, 'shape', ()))}"
    return packed


@exercise("6.3")
def test_pack_equals_minillm_on_random_codes(lab):
    """pack_int4 equals minillm's on random codes of shapes [5, 8], [4, 7], [2, 3, 9], [6, 1]"""
    for seed, shape in enumerate([(5, 8), (4, 7), (2, 3, 9), (6, 1)]):
        codes = random_codes(630 + seed, *shape)
        what = f"pack_int4 of codes of shape {shape}"
        packed = packed_of(lab, codes, what)
        want = codecs.pack_int4(codes)
        assert torch.equal(packed, want), f"{what}: {int((packed != want).sum())} of {want.numel()} bytes differ"


def seeded_shapes(seed: int) -> list[tuple[int, ...]]:
    """One to four dimensions, the last one even or odd (1 included), up to 101 codes a row."""
    rng = random.Random(seed)
    return [tuple(rng.randint(1, 4) for _ in range(rng.randint(0, 3))) + (rng.choice([1, 2, 3, rng.randint(4, 101)]),)
            for _ in range(12)]


@exercise("6.3")
def test_pack_equals_minillm_on_seeded_shapes(lab):
    """seeded shapes of one to four dimensions, last dimensions odd and even: minillm's bytes"""
    for case, shape in enumerate(seeded_shapes(634)):
        codes = random_codes(6340 + case, *shape)
        what = f"pack_int4 of codes of shape {shape}"
        packed, want = packed_of(lab, codes, what), codecs.pack_int4(codes)
        assert torch.equal(packed, want), f"{what}: {int((packed != want).sum())} of {want.numel()} bytes differ"


@exercise("6.3")
def test_pack_puts_the_even_index_in_the_low_nibble(lab):
    """[1, 2, 3, 4] -> [1 + 16 * 2, 3 + 16 * 4] = [33, 67]; [15, 0] -> [15]; [0, 15] -> [240]"""
    for codes, want in (([1, 2, 3, 4], [33, 67]), ([15, 0], [15]), ([0, 15], [240])):
        packed = packed_of(lab, torch.tensor(codes, dtype=torch.uint8), f"pack_int4({codes})")
        assert packed.tolist() == want, f"pack_int4({codes}) gave {packed.tolist()}, expected {want}"


@exercise("6.3")
def test_pack_pads_an_odd_length_with_a_zero_code(lab):
    """[1, 2, 3, 4, 5] -> [33, 67, 5]: the padding code is 0"""
    for codes, want in (([1, 2, 3, 4, 5], [33, 67, 5]), ([9], [9]), ([7, 7, 15], [119, 15])):
        packed = packed_of(lab, torch.tensor(codes, dtype=torch.uint8), f"pack_int4({codes})")
        assert packed.tolist() == want, f"pack_int4({codes}) gave {packed.tolist()}, expected {want}"


# -- 6.4 unpack --------------------------------------------------------------------------------
def unpacked_of(lab, packed: torch.Tensor, n: int, what: str) -> torch.Tensor:
    codes = lab.unpack_int4(packed.clone(), n)
    shape = (*packed.shape[:-1], n)
    assert isinstance(codes, torch.Tensor) and codes.dtype == torch.uint8 and codes.shape == shape, \
        f"{what}: unpack_int4 must return uint8 of shape {shape}, got {getattr(codes, 'dtype', None)} " \
        f"{tuple(getattr(codes, 'shape', ()))}"
    return codes


@exercise("6.4")
def test_unpack_equals_minillm_on_random_bytes(lab):
    """unpack_int4 equals minillm's on random bytes, even and odd n, 2-D and 3-D"""
    for seed, (shape, n) in enumerate([((5, 4), 8), ((4, 4), 7), ((2, 3, 5), 9), ((6, 1), 1)]):
        packed = torch.randint(0, 256, shape, generator=torch.Generator().manual_seed(640 + seed), dtype=torch.uint8)
        what = f"unpack_int4 of bytes of shape {shape}, n = {n}"
        got, want = unpacked_of(lab, packed, n, what), codecs.unpack_int4(packed, n)
        assert torch.equal(got, want), f"{what}: {int((got != want).sum())} of {want.numel()} codes differ"


@exercise("6.4")
def test_unpack_inverts_pack(lab):
    """unpack_int4(pack(codes), n) == codes for random codes, odd n included"""
    for seed, shape in enumerate([(3, 10), (5, 13), (1, 1), (2, 2, 7)]):
        codes = random_codes(645 + seed, *shape)
        what = f"unpack_int4 of minillm's pack_int4 of codes of shape {shape}"
        got = unpacked_of(lab, codecs.pack_int4(codes), shape[-1], what)
        assert torch.equal(got, codes), f"{what}: {int((got != codes).sum())} of {codes.numel()} codes differ"


@exercise("6.4")
def test_unpack_inverts_pack_on_seeded_shapes(lab):
    """seeded shapes of one to four dimensions, n odd and even: the codes minillm packed come back"""
    for case, shape in enumerate(seeded_shapes(648)):
        codes = random_codes(6480 + case, *shape)
        what = f"unpack_int4 of minillm's pack_int4 of codes of shape {shape}"
        got = unpacked_of(lab, codecs.pack_int4(codes), shape[-1], what)
        assert torch.equal(got, codes), f"{what}: {int((got != codes).sum())} of {codes.numel()} codes differ"


@exercise("6.4")
def test_unpack_reads_the_low_nibble_first_and_drops_the_padding(lab):
    """[33, 67, 5] with n = 5 -> [1, 2, 3, 4, 5]; [240] with n = 2 -> [0, 15], with n = 1 -> [0]"""
    for packed, n, want in (([33, 67, 5], 5, [1, 2, 3, 4, 5]), ([240], 2, [0, 15]), ([240], 1, [0]),
                            ([119, 15], 3, [7, 7, 15])):
        got = unpacked_of(lab, torch.tensor(packed, dtype=torch.uint8), n, f"unpack_int4({packed}, {n})")
        assert got.tolist() == want, f"unpack_int4({packed}, {n}) gave {got.tolist()}, expected {want}"


# -- 6.5 the quantized linear layer --------------------------------------------------------------
def int4_layer(seed: int, out_features: int, in_features: int, group_size: int, bias: bool):
    """(packed, scale, zero, bias) of a random weight, quantized by minillm."""
    codes, scale, zero = codecs.quantize_int4(weights(seed, out_features, in_features), group_size)
    return codecs.pack_int4(codes), scale, zero, (randn(seed + 2, out_features) if bias else None)


def linear_of(lab, x, packed, scale, zero, bias, what: str) -> torch.Tensor:
    inputs = [t.clone() if t is not None else None for t in (x, packed, scale, zero, bias)]
    y = lab.int4_linear(*inputs)
    assert all(t is None or torch.equal(t, c) for t, c in zip((x, packed, scale, zero, bias), inputs)), \
        f"{what}: int4_linear changed one of its inputs"
    return y


@exercise("6.5")
def test_int4_linear_equals_minillm(lab):
    """int4_linear equals x @ dequant(W)^T + bias (several groups, out != in, with and without bias, 1 to 5 rows)"""
    cases = [(650, 7, 192, 64, True, 3), (651, 33, 64, 32, False, 1), (652, 128, 256, 128, True, 5),
             (653, 5, 384, 32, False, 2)]
    for seed, out_features, in_features, group_size, bias, rows in cases:
        packed, scale, zero, b = int4_layer(seed, out_features, in_features, group_size, bias)
        x = randn(seed + 5, rows, in_features)
        what = (f"int4_linear, x [{rows}, {in_features}], {out_features} outputs, groups of {group_size}, "
                f"{'with' if bias else 'without'} bias")
        want = reference_int4_linear(x, packed, scale, zero, b)
        assert_close(linear_of(lab, x, packed, scale, zero, b, what), want, what, atol=1e-4, rtol=1e-5)


@exercise("6.5")
def test_int4_linear_with_an_odd_number_of_inputs(lab):
    """45 inputs in 3 groups of 15: 23 packed bytes per row, the padding code ignored"""
    packed, scale, zero, b = int4_layer(655, 6, 45, 15, True)
    x = randn(656, 4, 45)
    what = "int4_linear with 45 inputs (groups of 15)"
    assert_close(linear_of(lab, x, packed, scale, zero, b, what), reference_int4_linear(x, packed, scale, zero, b),
                 what, atol=1e-4, rtol=1e-5)


@exercise("6.5")
def test_int4_linear_adds_the_bias(lab):
    """with a bias the output is the output without it, plus the bias on every row"""
    packed, scale, zero, b = int4_layer(657, 12, 64, 16, True)
    x = randn(658, 3, 64)
    with_bias = linear_of(lab, x, packed, scale, zero, b, "int4_linear with a bias")
    without = linear_of(lab, x, packed, scale, zero, None, "int4_linear without a bias")
    assert_close(with_bias - without, b.expand(3, -1), "int4_linear: (output with bias) - (output without)",
                 atol=1e-5, rtol=1e-5)


@exercise("6.5")
def test_int4_linear_for_seeded_group_sizes(lab):
    """seeded group sizes (1, odd ones, a whole row) and shapes: x @ dequant(W)^T + bias"""
    rng = random.Random(661)
    for case, group_size in enumerate((1, rng.randint(3, 9), rng.randint(10, 30), 56)):
        in_features = group_size * (rng.randint(1, 4) if group_size < 56 else 1)
        out_features, rows = rng.randint(1, 40), rng.randint(1, 6)
        packed, scale, zero, b = int4_layer(6610 + case, out_features, in_features, group_size, case % 2 == 0)
        x = randn(6620 + case, rows, in_features)
        what = f"int4_linear, x [{rows}, {in_features}], {out_features} outputs, groups of {group_size}"
        want = reference_int4_linear(x, packed, scale, zero, b)
        assert_close(linear_of(lab, x, packed, scale, zero, b, what), want, what, atol=1e-4, rtol=1e-5)


@exercise("6.5")
def test_int4_linear_answers_in_the_dtype_of_x_whatever_it_is(lab):
    """x (and the bias) in float64, float16 or bfloat16: the output has x's dtype, close to the float32 result"""
    packed, scale, zero, b = int4_layer(663, 24, 96, 32, True)
    x = randn(664, 3, 96)
    want = reference_int4_linear(x, packed, scale, zero, b)
    for dtype, tol in ((torch.float64, 1e-4), (torch.float16, 0.05), (torch.bfloat16, 0.1)):
        what = f"int4_linear with x and bias in {dtype}"
        y = linear_of(lab, x.to(dtype), packed, scale, zero, b.to(dtype), what)
        assert isinstance(y, torch.Tensor) and y.dtype == dtype, \
            f"{what}: the output is {getattr(y, 'dtype', type(y).__name__)}, expected {dtype}"
        assert_close(y.float(), want, what, atol=tol, rtol=tol / 5)


# -- 6.6 layer sensitivity -----------------------------------------------------------------------


@cache
def tiny_and_reference() -> tuple[torch.nn.Module, Reference]:
    """tiny in full precision and its log-probabilities on 3 seeded windows of 48 tokens (kept pristine:
    every test hands the notebook a copy)."""
    model = LLM("tiny").engine.model
    windows = torch.randint(1, model.config.vocab_size, (3, 49), generator=torch.Generator().manual_seed(666))
    return model, Reference(model, windows)


def sensitivity_of(lab, base: QuantConfig, what: str) -> tuple[list, list]:
    """(the notebook's per-layer Quality list, minillm's), the notebook's computed on a copy of tiny."""
    model, reference = tiny_and_reference()
    with one_thread():
        got = lab.layer_sensitivity(copy.deepcopy(model), reference, base)
        want = reference_layer_sensitivity(model, reference, base)
    assert isinstance(got, list) and len(got) == len(want), \
        f"{what}: layer_sensitivity must return a list of {len(want)} Quality (one per layer), got " \
        f"{type(got).__name__} of length {len(got) if hasattr(got, '__len__') else '?'}"
    assert all(isinstance(q, Quality) for q in got), f"{what}: every item must be a Quality (reference.compare's)"
    return got, want


def assert_same_quality(got: list, want: list, what: str) -> None:
    for i, (g, w) in enumerate(zip(got, want)):
        for field in ("kl", "perplexity", "top1"):
            a, b = getattr(g, field), getattr(w, field)
            assert math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-9), \
                f"{what}: layer {i} quantized alone has {field} {a:.6g}, expected {b:.6g}"


@exercise("6.6")
def test_layer_sensitivity_equals_minillm_for_int4_on_the_mlp(lab):
    """int4, groups of 32, only the MLP's projections: each layer alone, as minillm's sweep measures it"""
    base = QuantConfig("int4", group_size=32, projections=("gate_proj", "up_proj", "down_proj"))
    what = f"layer_sensitivity on tiny, base {base.label()}"
    assert_same_quality(*sensitivity_of(lab, base, what), what)


@exercise("6.6")
def test_layer_sensitivity_equals_minillm_for_int8_on_attention(lab):
    """int8 on the attention's q and o projections: each layer alone, as minillm's sweep measures it"""
    base = QuantConfig("int8", projections=("q_proj", "o_proj"))
    what = f"layer_sensitivity on tiny, base {base.label()}"
    assert_same_quality(*sensitivity_of(lab, base, what), what)


@exercise("6.6")
def test_layer_sensitivity_when_the_base_already_picks_some_layers(lab):
    """a base that picks layers of its own (and a seeded group size, two projections): still every layer alone,
    one Quality per layer of the model, the base's layers ignored"""
    rng = random.Random(667)
    layers = tuple(sorted(rng.sample(range(len(tiny_and_reference()[0].model.layers)), 2)))
    base = QuantConfig("int4", group_size=rng.choice([8, 16]), layers=layers, projections=("k_proj", "down_proj"))
    what = f"layer_sensitivity on tiny, base {base.label()} (projections k and down)"
    assert_same_quality(*sensitivity_of(lab, base, what), what)


@exercise("6.6")
def test_layer_sensitivity_leaves_the_model_in_full_precision(lab):
    """the model it is given keeps every weight and is not quantized afterwards"""
    model, reference = tiny_and_reference()
    mine = copy.deepcopy(model)
    with one_thread():
        lab.layer_sensitivity(mine, reference, QuantConfig("int4", group_size=64))
    quantized = [name for name, m in mine.named_modules() if isinstance(m, QuantizedLinear)]
    assert not quantized and getattr(mine, "quant_config", None) is None, \
        f"layer_sensitivity quantized the model it was given ({quantized[:3]}...): quantize a copy"
    pristine = model.state_dict()
    changed = [name for name, p in mine.state_dict().items() if not torch.equal(p, pristine[name])]
    assert not changed, f"layer_sensitivity changed the model's weights: {changed[:3]}"


# -- 6.7 cancellations ---------------------------------------------------------------------------
def brute_force_cancellations(errors: dict, z: float) -> list[tuple[frozenset, frozenset]]:
    """Every split of every measured set into two measured parts, the paired test written out in float64."""
    found = []
    for s in errors:
        layers = sorted(s)
        for r in range(1, len(layers)):
            for part in itertools.combinations(layers, r):
                a = frozenset(part)
                b = s - a
                if layers[0] not in a or a not in errors or b not in errors:
                    continue
                d = [x - y - w for x, y, w in zip(errors[s], errors[a], errors[b])]
                n = len(d)
                mean = sum(d) / n
                sd = math.sqrt(sum((v - mean) ** 2 for v in d) / (n - 1))
                margin = abs(mean + z * sd / math.sqrt(n))
                assert margin > 1e-9 * (abs(mean) + 1e-12), "grader data: a pair sits on the threshold"
                if mean < -z * sd / math.sqrt(n):
                    found.append((mean, a, b))
    found.sort(key=lambda f: f[0])
    return [(a, b) for _, a, b in found]


def random_errors(seed: int, layers: int = 5, windows: int | None = None, labels: list[int] | None = None) -> dict:
    """Per-window errors of many sets of layers: each layer's own error, scaled by how hard each window is,
    plus a planted interaction per set (cancelling, compounding or none) and noise; a few sets unmeasured.
    Layer i is called labels[i] (default: i)."""
    gen = torch.Generator().manual_seed(seed)
    windows = windows or 5 + seed % 8
    labels = labels or list(range(layers))
    hardness = 0.5 + torch.rand(windows, generator=gen) * 2                      # [windows]
    own = torch.rand(layers, generator=gen) * 0.1                                # [layers]
    errors = {}
    for r in range(1, layers + 1):
        for s in itertools.combinations(range(layers), r):
            if torch.rand((), generator=gen) < 0.15:
                continue  # not measured
            planted = float(torch.randn((), generator=gen)) * 0.03 if r > 1 else 0.0
            noise = torch.randn(windows, generator=gen) * 0.004
            values = hardness * (own[list(s)].sum() + planted) + noise
            values = values.abs().tolist()
            errors[frozenset(labels[i] for i in s)] = tuple(values) if seed % 2 else values
    return errors


def cancellations_of(lab, errors: dict, z: float, what: str) -> list:
    before = copy.deepcopy(errors)
    got = lab.find_cancellations(errors, z)
    assert errors == before, f"{what}: find_cancellations changed its input"
    assert isinstance(got, list), f"{what}: find_cancellations must return a list, got {type(got).__name__}"
    return [tuple(p) for p in got]


def pairs_text(pairs) -> str:
    return "[" + ", ".join(f"({sorted(a)}, {sorted(b)})" for a, b in pairs) + "]"


def pairs_difference(got, want) -> str:
    """What a found list lacks, adds or repeats against the expected one, short; or where their order first differs."""
    got_sets, want_sets = [frozenset({a, b}) for a, b in got], [frozenset({a, b}) for a, b in want]
    missing = [p for p, s in zip(want, want_sets) if s not in got_sets]
    extra = [p for p, s in zip(got, got_sets) if s not in want_sets]
    twice = [p for i, (p, s) in enumerate(zip(got, got_sets)) if s in got_sets[:i]]
    parts = [f"found {len(got)}, expected {len(want)}"]
    for label, pairs in (("missing", missing), ("not expected", extra), ("reported more than once", twice)):
        if pairs:
            more = f" and {len(pairs) - 3} more" if len(pairs) > 3 else ""
            parts.append(f"{label}: {pairs_text(pairs[:3])}{more}")
    if not missing and not extra and not twice:
        i = next(i for i, (g, w) in enumerate(zip(got_sets, want_sets)) if g != w)
        parts.append(f"the same pairs in another order: position {i} holds {pairs_text(got[i:i + 1])}, expected "
                     f"{pairs_text(want[i:i + 1])} (most negative mean interaction first)")
    return "; ".join(parts)


@exercise("6.7")
def test_cancellations_equal_a_brute_force_search_on_random_sweeps(lab):
    """seeded sweeps over 5 layers (2 to 12 windows, some sets unmeasured, layers named by scattered numbers), z = 2,
    z = 1 and a seeded z: the same pairs, in order"""
    rng = random.Random(670)
    sweeps = [random_errors(seed) for seed in range(670, 678)]
    sweeps += [random_errors(6780 + n, windows=n, labels=rng.sample(range(3, 90), 5)) for n in (2, 3, 4)]
    for seed, errors in enumerate(sweeps, start=670):
        for z in (2.0, 1.0, round(rng.uniform(0.3, 3.5), 3)):
            want = brute_force_cancellations(errors, z)
            got = cancellations_of(lab, errors, z, f"sweep seed {seed}, z = {z}")
            assert [frozenset({a, b}) for a, b in got] == [frozenset({a, b}) for a, b in want], \
                (f"find_cancellations on the sweep of seed {seed} ({len(errors)} sets, z = {z}): "
                 f"{pairs_difference(got, want)}")


@exercise("6.7")
def test_cancellations_pair_each_window_with_itself(lab):
    """a steady interaction under large window-to-window swings is found (the test is paired, window by window)"""
    errors = {frozenset({0}): [0.10, 0.20, 0.90, 0.15], frozenset({1}): [0.05, 0.10, 0.60, 0.05],
              frozenset({0, 1}): [0.11, 0.26, 1.45, 0.16]}
    got = cancellations_of(lab, errors, 2.0, "a steady cancellation")
    want = [(frozenset({0}), frozenset({1}))]
    assert got == want, (f"find_cancellations: layers 0 and 1 lose 0.04 to 0.05 to the sum of each alone on every "
                         f"window ({errors}); expected {pairs_text(want)}, got {pairs_text(got)}")


@exercise("6.7")
def test_cancellations_use_the_standard_error_of_the_mean_with_n_minus_one(lab):
    """interactions -0.01, -0.02, -0.03, -0.04 (mean/se = -3.87 with n - 1): found at z = 3.5, not at z = 4.2"""
    errors = {frozenset({2}): [0.5] * 4, frozenset({4}): [0.25] * 4,
              frozenset({2, 4}): [0.75 - 0.01, 0.75 - 0.02, 0.75 - 0.03, 0.75 - 0.04]}
    for z, want in ((3.5, [(frozenset({2}), frozenset({4}))]), (4.2, [])):
        got = cancellations_of(lab, errors, z, f"z = {z}")
        assert got == want, (f"find_cancellations with interactions -0.01, -0.02, -0.03, -0.04 per window and z = {z}: "
                             f"got {pairs_text(got)}, expected {pairs_text(want)}")


@exercise("6.7")
def test_cancellations_with_the_same_interaction_on_every_window(lab):
    """an interaction of exactly -0.25 on every window (standard error 0) cancels"""
    errors = {frozenset({0}): [0.5, 0.25, 1.0], frozenset({1}): [0.25, 0.5, 0.5], frozenset({0, 1}): [0.5, 0.5, 1.25]}
    got = cancellations_of(lab, errors, 2.0, "a constant interaction")
    want = [(frozenset({0}), frozenset({1}))]
    assert got == want, f"find_cancellations with d = -0.25 on every window: got {pairs_text(got)}, expected " \
                        f"{pairs_text(want)}"


def interaction_of(z: float, c: float, shift: float, windows=(1.5, 0.75, 2.0, 1.25), others=(0.5, 1.0, 0.25, 0.75)):
    """Errors of {7}, {23} and {7, 23} on 4 windows, with the interaction d_w = -z c + c [1, 1, 1, -3] + shift:
    mean(d) = -z c + shift, sample standard deviation exactly 2c, se exactly c. Every value is a short binary
    fraction, so each step (differences, mean, deviations, squares, the sqrt, the division by sqrt(4))
    is exact in float32 and float64 alike: mean == -z * se holds exactly at shift = 0, in any correct order."""
    d = [-z * c + c * v + shift for v in (1, 1, 1, -3)]
    return {frozenset({7}): list(windows), frozenset({23}): list(others),
            frozenset({7, 23}): [a + b + e for a, b, e in zip(windows, others, d)]}


@exercise("6.7")
def test_cancellations_at_the_threshold_itself(lab):
    """mean(d) exactly -z * se is no cancellation (the test is strict), a hair below is one, a hair above is not;
    seeded z far from 2, and z = 0 (any mean below 0 cancels, a mean of exactly 0 does not)"""
    rng = random.Random(679)
    pair = [(frozenset({7}), frozenset({23}))]
    for z in (0.0, rng.randint(4, 12) / 8, rng.randint(20, 40) / 8):
        for c in (2.0 ** -4, 2.0 ** -9):
            hair = c * 2.0 ** -8
            for shift, want, where in ((0.0, [], "exactly at"), (-hair, pair, "just below"), (hair, [], "just above")):
                errors = interaction_of(z, c, shift)
                d = [s - a - b for s, a, b in zip(errors[frozenset({7, 23})], errors[frozenset({7})],
                                                    errors[frozenset({23})])]
                what = (f"interactions {d} (mean {sum(d) / 4!r}, standard error {c!r}) {where} the threshold "
                        f"-z * se with z = {z}")
                got = cancellations_of(lab, errors, z, what)
                assert got == want, f"find_cancellations: {what}: got {pairs_text(got)}, expected {pairs_text(want)}"
    additive = {frozenset({0}): [0.5, 0.25, 1.0], frozenset({1}): [0.25, 0.5, 0.5],
                frozenset({0, 1}): [0.75, 0.75, 1.5]}
    for z in (0.0, 2.0):
        got = cancellations_of(lab, additive, z, f"errors that add up exactly, z = {z}")
        assert got == [], \
            f"find_cancellations: errors that add up exactly on every window (d = 0) gave {pairs_text(got)}"


@exercise("6.7")
def test_cancellations_with_nothing_to_split(lab):
    """nothing measured, single layers only, or sets whose parts were not measured: no pairs"""
    cases = [({}, "no measured sets"), ({frozenset({0}): [0.1, 0.2], frozenset({3}): [0.3, 0.1]}, "single layers"),
             ({frozenset({0, 1}): [0.0, 0.01, 0.0], frozenset({0}): [0.5, 0.4, 0.6]}, "{0, 1} without {1}")]
    for errors, label in cases:
        got = cancellations_of(lab, errors, 2.0, label)
        assert got == [], f"find_cancellations with {label}: got {pairs_text(got)}, expected []"


@exercise("6.7")
def test_cancellations_split_a_set_only_into_disjoint_parts(lab):
    """{0, 1} and {1, 2} overlap: they are no split of {0, 1, 2}, however their errors compare"""
    base = [0.1, 0.2, 0.15, 0.3]
    errors = {frozenset({0}): [v * 1.0 for v in base], frozenset({2}): [v * 3.0 for v in base],
              frozenset({0, 1}): [v * 3.0 for v in base], frozenset({1, 2}): [v * 5.0 for v in base],
              frozenset({0, 1, 2}): [v * 6.0 + e for v, e in zip(base, (0.001, -0.002, 0.0015, 0.0))]}
    got = cancellations_of(lab, errors, 2.0, "overlapping sets")
    assert got == [], (f"find_cancellations reported {pairs_text(got)}; the only splits of {{0, 1, 2}} measured are "
                       f"{{0}} + {{1, 2}} and {{0, 1}} + {{2}}, whose errors add up")


@exercise("6.7")
def test_cancellations_report_each_pair_once_most_negative_first(lab):
    """each pair once, its first set holding the smallest layer, sorted by the mean interaction"""
    windows = [1.0, 1.5, 0.8, 1.2, 1.1]
    errors = {frozenset({i}): [0.1 * (i + 1) * w for w in windows] for i in range(4)}
    for (i, j), loss in (((2, 3), 0.02), ((0, 1), 0.05), ((1, 3), 0.08), ((0, 2), 0.0)):
        errors[frozenset({i, j})] = [(0.1 * (i + 1) + 0.1 * (j + 1) - loss) * w + 0.001 * k
                                     for k, w in enumerate(windows)]
    got = cancellations_of(lab, errors, 2.0, "three cancelling pairs")
    want = [(frozenset({1}), frozenset({3})), (frozenset({0}), frozenset({1})), (frozenset({2}), frozenset({3}))]
    assert got == want, f"find_cancellations: got {pairs_text(got)}, expected {pairs_text(want)} (strongest first)"


# -- 6.E the codecs and the int4 layer inside the engine ------------------------------------------
INT4_G64, INT8 = QuantConfig("int4", group_size=64), QuantConfig("int8")


@exercise("6.E", timeout=240)
def test_your_codecs_and_int4_layer_run_the_real_engine(lab):
    ("the real engine with your codecs and int4 layer (int4 groups of 64, and int8) gives the reference engine's "
     "logits on tiny and its tokens on the end-to-end workload")
    components = lab_components(lab, labs=["06"])
    int4_parts = replace(components, quantize_int8=None)
    int8_parts = Components(quantize_int8=components.quantize_int8, source=components.source)
    ids = torch.randint(1, 4096, (40,), generator=torch.Generator().manual_seed(606))
    with one_thread():
        full = LLM("tiny").logits(ids)
        for config, parts in ((INT4_G64, int4_parts), (INT8, int8_parts)):
            mine = LLM("tiny", quantization=config, components=parts).logits(ids)
            want = LLM("tiny", quantization=config).logits(ids)
            assert not torch.equal(want, full), f"the reference engine's {config.label()} logits equal full precision's"
            assert_close(mine, want, f"tiny's logits with your parts, quantized {config.label()}", atol=1e-4, rtol=1e-4)
        check_against_reference(int4_parts, quantization=INT4_G64)
