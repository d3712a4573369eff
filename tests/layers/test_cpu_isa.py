"""The C++ CPU kernels built for older x86 CPUs than this one: AVX2 without AVX-512 (the 16-float vectors become
pairs of 8, and bytes are widened with AVX2's instructions) and plain x86-64 (the portable loops). The kernels
are built with `-march=native`, so a run on an AVX-512 machine never reaches those paths; here each library is
built again with other flags, put in place of the native one, and held to the same references as in
test_quant_fused, test_cpu_ops, test_linear, test_paged_decode_cpu and test_cpu_decode, whose test bodies run again
unchanged."""
import platform
from pathlib import Path

import pytest
import test_cpu_decode
import test_cpu_ops
import test_linear
import test_paged_decode_cpu
import test_quant_fused
import torch

from minillm.kernels import paged_decode_cpu
from minillm.layers import cpu_ops
from minillm.models import cpu_decode
from minillm.quant import fused

# instruction set -> the flags after g++'s -march=native, and the CPU flags it needs to run
# (the x86-64 build reads weights in panels, as AVX-512 builds do, and the AVX2 build row by row: each machine
# tests both layouts of cpu_ops.cpp's product)
ISAS = {"avx2": (("-march=haswell", "-mno-avx512f"), {"avx2", "fma", "f16c"}),
        "x86-64": (("-march=x86-64", "-DMINILLM_WEIGHT_PANELS=1"), set())}
KERNELS = (fused, cpu_ops, paged_decode_cpu)


def cpu_flags() -> set[str]:
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.is_file() else []
    return set(next((line.split(":", 1)[1].split() for line in lines if line.startswith("flags")), []))


@pytest.fixture(params=list(ISAS))
def built_for(request, monkeypatch):
    """Every CPU kernel library replaced by its build for the instruction set named by the parameter."""
    flags, needs = ISAS[request.param]
    if platform.machine() != "x86_64" or not needs <= cpu_flags():
        pytest.skip(f"this CPU cannot run an {request.param} build")
    if fused.library() is None:
        pytest.skip("no C++ compiler: the kernels do not exist here")
    for module in KERNELS:
        lib = module.library(flags)
        assert lib is not None, f"{module.__name__} does not build with {flags}"
        monkeypatch.setattr(module, "library", lambda flags=(), lib=lib: lib)
    return request.param


@torch.inference_mode()
def test_the_int8_and_int4_kernels_equal_the_reference(built_for):
    for n, k in test_quant_fused.INT8_SHAPES:
        for rows in (1, 3, 5):
            test_quant_fused.test_fused_int8_equals_the_reference_and_float64(n, k, rows)
    for n, k, group_size in test_quant_fused.INT4_SHAPES:
        for int4_range in ("holds-zero", "min-max"):
            for rows in (1, 5):
                test_quant_fused.test_fused_int4_equals_the_reference_and_float64(n, k, group_size, int4_range, rows)


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_the_layers_operators_equal_the_torch_formulas(built_for, monkeypatch, restore_threads):
    for threads in (1, 2):
        torch.set_num_threads(threads)
        for rows, n in test_cpu_ops.SHAPES:
            test_cpu_ops.test_add_rms_norm_equals_the_torch_formula_and_updates_the_stream_in_place(rows, n, threads)
        for rows, heads, d in [(1, 13, 64), (3, 5, 8), (300, 4, 64)]:
            test_cpu_ops.test_rotary_rotates_a_view_of_the_qkv_product_in_place(rows, heads, d, threads)
        for rows, inter in [(1, 1536), (2, 7), (300, 256)]:
            test_cpu_ops.test_silu_mul_equals_the_torch_formula_from_deep_negatives_to_large_positives(rows, inter,
                                                                                                     threads)
    torch.set_num_threads(1)
    with torch.inference_mode():
        for rows in [*range(1, 10), 13, 17, cpu_ops.MAX_ROWS]:  # AVX2's tile of x is 4 rows; AVX-512's 6
            for shape, bias in [((576, 960), False), ((37, 51), True), ((5, 3), False), ((47, 6), False)]:
                with monkeypatch.context() as patch:
                    test_linear.test_up_to_max_rows_take_the_cpp_product_and_equal_f_linear(rows, shape, bias, patch)


def test_paged_decode_attention_equals_the_reference(built_for):
    for case in [(0, 5, 9, 3, 64, 16), (2, 7, 8, 1, 24, 4), (3, 2, 6, 2, 7, 5)]:
        test_paged_decode_cpu.test_each_row_equals_the_reference_to_its_own_length(*case)
    test_paged_decode_cpu.test_lengths_at_the_edges_of_a_block()
    for gain in (50.0, 3.0):
        test_paged_decode_cpu.test_large_scores_neither_overflow_nor_lose_their_small_terms(gain)


def test_a_decode_step_of_cpp_layers_equals_the_layers_own_path(built_for, monkeypatch, restore_threads):
    calls = []
    run = cpu_decode.CpuDecode.run
    monkeypatch.setattr(cpu_decode.CpuDecode, "run", lambda self, i, h, x: calls.append(i) or run(self, i, h, x))
    test_cpu_decode.test_the_cpp_layers_equal_the_layers_own_path_to_the_bit("tiny", 4, 1, None, calls)
