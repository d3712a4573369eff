"""models/huge_pages.py: a model's weights moved into one allocation advised for 2 MiB pages keep their values,
shapes, strides and ties; load_model (models/prepare.py) moves a model that streams from memory; and the model
computes what it did."""
import pytest
import torch

from minillm import LLM
from minillm.layers import cpu_ops
from minillm.layers.linear import Linear
from minillm.models import huge_pages, prepare
from minillm.models.huge_pages import HUGE_PAGE, dense, to_huge_pages


class Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(50, 8)
        self.head = torch.nn.Linear(8, 50, bias=False)
        self.head.weight = self.embed.weight  # tied, as SmolLM2's head is
        self.proj = torch.nn.Linear(8, 12)
        self.proj.weight.data = self.proj.weight.data.t().contiguous().t()  # column by column
        self.register_buffer("table", torch.arange(30.0).view(5, 6))
        self.register_buffer("nothing", None)


def test_every_tensor_moves_once_keeping_values_strides_and_ties():
    torch.manual_seed(0)
    model = Tied()
    before = {name: t.clone() for name, t in [*model.named_parameters(), *model.named_buffers()]}
    strides = {name: t.stride() for name, t in model.named_parameters()}
    first = model.embed.weight
    if not to_huge_pages(model):  # no madvise here (not Linux, or refused): nothing may have changed
        assert model.embed.weight.data_ptr() == first.data_ptr()
        pytest.skip("madvise is missing or refused here")
    assert model.head.weight is model.embed.weight is first  # the same Parameter, its data moved
    assert model.embed.weight.data_ptr() % HUGE_PAGE == 0    # the first tensor opens the advised range
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        assert torch.equal(t, before[name]), name
    assert {name: t.stride() for name, t in model.named_parameters()} == strides
    pointers = sorted(t.data_ptr() for t in [*model.parameters(), *model.buffers()])
    assert pointers[-1] - pointers[0] < HUGE_PAGE and all(p % huge_pages.ALIGN == 0 for p in pointers)  # one block
    assert model.nothing is None
    x = torch.tensor([[1, 7, 49]])
    torch.testing.assert_close(model.head(model.embed(x)), model.embed(x) @ before["embed.weight"].T)


def test_the_cpp_products_panel_copies_are_made_in_huge_pages_once_for_a_tied_weight():
    torch.manual_seed(0)
    model = torch.nn.Sequential(Linear(8, 50, bias=False), Linear(50, 12), Linear(12, 12, bias=False),
                                Linear(12, 12, bias=False))
    model[3].weight = model[2].weight  # tied
    for m in model:
        m.few_rows = True
    if cpu_ops.library() is None or not cpu_ops.panel():
        pytest.skip("the C++ product reads the weights as they are here: no copies")
    if not to_huge_pages(model):
        pytest.skip("madvise is missing or refused here")
    copies = [m.few_rows_weight() for m in model]
    assert copies[0].data_ptr() % HUGE_PAGE == 0 and copies[2] is copies[3]  # the first opens the range; one for a tie
    assert max(c.data_ptr() for c in copies) - copies[0].data_ptr() < HUGE_PAGE  # one allocation
    for m, c in zip(model, copies):
        assert torch.equal(c, cpu_ops.pack(m.weight.detach()))
    x = torch.randn(3, 8)
    with torch.inference_mode():
        torch.testing.assert_close(model(x), torch.nn.functional.linear(
            torch.nn.functional.linear(torch.nn.functional.linear(torch.nn.functional.linear(x, model[0].weight),
                                                                  model[1].weight, model[1].bias), model[2].weight),
            model[3].weight))


def test_dense_tells_a_block_of_elements_from_a_strided_view():
    t = torch.zeros(6, 4)
    assert dense(t) and dense(t.t()) and dense(t[:, None]) and dense(torch.zeros(0))
    assert not dense(t[:, :2]) and not dense(t[::2]) and not dense(torch.zeros(3).expand(2, 3))


def test_the_loader_moves_a_model_that_streams_from_memory_and_its_logits_do_not_change(monkeypatch):
    plain = LLM("tiny")  # 23 MB: in the caches, left where it is
    ids = plain.tokenizer.encode("def fib(n):\n    return")
    monkeypatch.setattr(prepare, "streamed", lambda model: True)
    moved = LLM("tiny")
    if huge_pages.huge_buffer(HUGE_PAGE) is None:
        pytest.skip("madvise is missing or refused here: the loader keeps ordinary pages")
    assert moved.model.model.embed_tokens.weight.data_ptr() % HUGE_PAGE == 0
    assert torch.equal(moved.logits(ids), plain.logits(ids))
