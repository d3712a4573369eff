"""The model's Linear: its CPU paths equal nn.Linear's product: the C++ matrix-vector product for one row, the
packed copy for a few; the loader's choice of them."""
import copy
import pickle

import pytest
import torch
import torch.nn.functional as F

from minillm.layers import cpu_ops, linear
from minillm.layers.linear import MAX_PACKED_ROWS, Linear

needs_onednn = pytest.mark.skipif(not linear.onednn_available(), reason="this torch build has no oneDNN")


def layer(inp: int, out: int, bias: bool, seed: int = 0) -> Linear:
    torch.manual_seed(seed)
    m = Linear(inp, out, bias=bias)
    m.packed = True  # as the loader sets it for a model too big for the caches
    m.weight.data.normal_()  # both signs, unit scale: a wrong row or column shows far above rounding
    if bias:
        m.bias.data.normal_()
    return m


@needs_onednn
@pytest.mark.parametrize("rows", [2, 3, 7, 16, 17, MAX_PACKED_ROWS])
@pytest.mark.parametrize("shape,bias", [((576, 960), False), ((37, 51), True), ((1536, 576), False)])
def test_packed_rows_equal_f_linear(rows, shape, bias):
    m = layer(*shape, bias)
    x = torch.randn(rows, shape[0], generator=torch.Generator().manual_seed(rows))
    with torch.inference_mode():
        got = m(x)
    assert m._packed is not None, "a product of a few rows did not take the packed path"
    torch.testing.assert_close(got, F.linear(x, m.weight, m.bias), rtol=1e-4, atol=1e-4)


@torch.inference_mode()
def test_one_row_and_many_rows_use_the_plain_weight():
    m = layer(64, 48, bias=True)
    for rows in (1, MAX_PACKED_ROWS + 1):
        x = torch.randn(rows, 64)
        assert torch.equal(m(x), F.linear(x, m.weight, m.bias))
    assert m._packed is None


@needs_onednn
@torch.inference_mode()
@pytest.mark.parametrize("shape,bias", [((576, 960), False), ((37, 51), True)])
def test_one_row_takes_the_packed_copy_where_the_loader_found_it_faster(shape, bias):
    m = layer(*shape, bias)
    m.packed_one_row = True
    x = torch.randn(1, shape[0], generator=torch.Generator().manual_seed(1))
    got = m(x)
    assert m._packed is not None, "one row did not take the packed path"
    torch.testing.assert_close(got, F.linear(x, m.weight, m.bias), rtol=1e-4, atol=1e-4)


def test_training_uses_the_plain_weight_and_gets_gradients():
    m = layer(32, 16, bias=False)
    x = torch.randn(4, 32)
    m(x).sum().backward()
    assert m._packed is None and m.weight.grad is not None
    torch.testing.assert_close(m.weight.grad, x.sum(0).expand(16, 32))


@needs_onednn
@torch.no_grad()
def test_a_changed_weight_is_packed_again():
    m = layer(40, 24, bias=False)
    x = torch.randn(4, 40)
    m(x)
    m.weight.mul_(-2)  # in place: the same storage, a new version
    torch.testing.assert_close(m(x), F.linear(x, m.weight), rtol=1e-4, atol=1e-4)
    m.weight.data = torch.randn(24, 40)  # a new storage
    torch.testing.assert_close(m(x), F.linear(x, m.weight), rtol=1e-4, atol=1e-4)


@needs_onednn
@torch.inference_mode()
def test_a_layer_with_a_packed_weight_deep_copies_and_pickles():
    m = layer(40, 24, bias=True)
    x = torch.randn(4, 40)
    m(x)
    assert m._packed is not None
    for twin in (copy.deepcopy(m), pickle.loads(pickle.dumps(m))):
        assert twin._packed is None and twin.weight.data_ptr() != m.weight.data_ptr()
        torch.testing.assert_close(twin(x), m(x), rtol=1e-5, atol=1e-5)


def test_the_loader_packs_only_models_that_stream_from_memory():
    from minillm import LLM
    assert not any(m.packed for m in LLM("tiny").model.modules() if isinstance(m, Linear))  # 23 MB: in the caches
    big = torch.nn.Sequential(Linear(4096, 8192, bias=False))  # 128 MiB
    assert linear.cpu_paths(big) is big[0].few_rows is (cpu_ops.library() is not None)
    assert big[0].packed and big[0].packed_one_row == (not big[0].few_rows and linear.packed_wins_at_one_row())


@pytest.mark.parametrize("wins", [True, False])
def test_without_the_cpp_product_one_row_is_packed_only_where_it_was_measured_faster(monkeypatch, wins):
    monkeypatch.setattr(linear, "packed_wins_at_one_row", lambda: wins)
    monkeypatch.setattr(cpu_ops, "library", lambda: None)  # no compiler
    big, small = torch.nn.Sequential(Linear(4096, 8192, bias=False)), torch.nn.Sequential(Linear(64, 64))
    for model in (big, small):
        assert not linear.cpu_paths(model)  # the loader then stores the weights column by column
    assert big[0].packed_one_row is wins and not small[0].packed_one_row  # small: in the caches, never packed


needs_cpp = pytest.mark.skipif(cpu_ops.library() is None, reason="no C++ compiler: the plain paths run")


@needs_cpp
@torch.inference_mode()
# every count of rows up to a tile of x (with panels: 1-3 rows keep several sums over alternate steps; 31 rows fill
# AVX-512's registers, 32 are 31 and 1; row by row: 4 on AVX2, 6 with AVX-512), then tiles and a partial one, up to
# MAX_ROWS; weights with 1-15 rows past the last whole panel (1-3 past a tile of rows), inner sizes with every tail
# past the sixteen lanes
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 6, 7, 8, 11, 13, 16, 17, 23, 31, cpu_ops.MAX_ROWS])
@pytest.mark.parametrize("shape,bias", [((576, 960), False), ((37, 51), True), ((1536, 577), True), ((5, 3), False),
                                        ((47, 6), False)])
def test_up_to_max_rows_take_the_cpp_product_and_equal_f_linear(rows, shape, bias, monkeypatch):
    m = layer(*shape, bias)
    m.few_rows = True
    calls = []
    monkeypatch.setattr(cpu_ops, "product", lambda *a, real=cpu_ops.product: calls.append(1) or real(*a))
    x = torch.randn(rows, shape[0], generator=torch.Generator().manual_seed(rows)) * 3
    expected = F.linear(x, m.weight, m.bias)
    torch.testing.assert_close(m(x), expected, rtol=1e-5, atol=1e-3)  # sums of up to 1536 terms of ~3: ~100
    assert calls == [1] and m._packed is None
    m.weight.data = m.weight.data.t().contiguous().t()  # column by column: the C++ product does not read that
    torch.testing.assert_close(m(x), expected, rtol=1e-5, atol=1e-3)
    assert calls == [1]


@needs_cpp
def test_pack_puts_each_panel_of_rows_column_by_column_and_pads_the_last():
    w = torch.arange(37 * 5, dtype=torch.float32).view(37, 5)
    packed, width = cpu_ops.pack(w), cpu_ops.panel()
    if not width:  # this build reads the weight as it is
        assert packed is w
        return
    assert packed.shape == (-(-37 // width), 5, width)
    for p in range(packed.shape[0]):
        for c in range(width):
            row = p * width + c
            expected = w[row] if row < 37 else torch.zeros(5)
            assert torch.equal(packed[p, :, c], expected), (p, c)


@needs_cpp
@torch.no_grad()
def test_the_cpp_product_sees_a_changed_weight():
    m = layer(40, 24, bias=False)
    m.few_rows = True
    x = torch.randn(3, 40)
    m(x)
    m.weight.mul_(-2)  # in place: the same storage, a new version (a panel copy must be made again)
    torch.testing.assert_close(m(x), F.linear(x, m.weight), rtol=1e-5, atol=1e-4)
    m.weight.data = torch.randn(24, 40)  # a new storage
    torch.testing.assert_close(m(x), F.linear(x, m.weight), rtol=1e-5, atol=1e-4)
    twin = copy.deepcopy(m)  # a copy makes its own
    assert twin._few_rows_weight is None
    torch.testing.assert_close(twin(x), m(x), rtol=0, atol=0)


@needs_cpp
@torch.inference_mode()
def test_more_than_max_rows_leave_the_cpp_product():
    m = layer(48, 40, bias=True)
    m.few_rows = True
    for rows in (cpu_ops.MAX_ROWS + 1, MAX_PACKED_ROWS):
        x = torch.randn(rows, 48)
        torch.testing.assert_close(m(x), F.linear(x, m.weight, m.bias), rtol=1e-4, atol=1e-4)
    assert m._packed is not None or not linear.onednn_available()


@needs_cpp
@torch.inference_mode()
def test_the_cpp_product_refuses_what_it_cannot_read():
    with pytest.raises(ValueError, match=r"got x \(1, 4\), weight \(3, 4\) torch.float32 \(not contiguous\)"):
        cpu_ops.linear(torch.randn(1, 4), torch.randn(4, 3).t(), None)
    too_many = cpu_ops.MAX_ROWS + 1
    with pytest.raises(ValueError, match=rf"x \[m <= {cpu_ops.MAX_ROWS}, k\].*got x \({too_many}, 4\)"):
        cpu_ops.linear(torch.randn(too_many, 4), torch.randn(3, 4), None)
    with pytest.raises(ValueError, match=r"got x \(1, 5\), weight \(3, 4\)"):
        cpu_ops.linear(torch.randn(1, 5), torch.randn(3, 4), None)
