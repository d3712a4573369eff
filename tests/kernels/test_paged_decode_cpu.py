"""The CPU paged decode kernel (kernels/paged_decode_cpu.cpp) against paged_decode_spec, the plain-PyTorch
reference, and the engine with it against the engine that gathers its blocks."""
import pytest
import torch

from minillm import LLM, SamplingParams
from minillm.kernels import paged_decode_cpu
from minillm.kernels.paged_decode_cpu import paged_decode_attention_cpu
from minillm.layers.attention import decode_attention

pytestmark = pytest.mark.skipif(not paged_decode_cpu.available(), reason="no C++ compiler: the kernel cannot be built")


def spec(q, k_slots, v_slots, tables, lens, block_size):
    """Each row over its own context, gathered slot by slot (as paged_decode.paged_decode_spec, without triton)."""
    out = torch.empty_like(q)
    for b, length in enumerate(lens.tolist()):
        t = torch.arange(length)
        slots = tables[b, t // block_size].long() * block_size + t % block_size
        out[b] = decode_attention(q[b:b + 1], k_slots[slots][None], v_slots[slots][None])[0]
    return out


def case(seed, batch, heads, kv_heads, d, block_size, blocks=40, lens=None):
    g = torch.Generator().manual_seed(seed)
    width = 6
    q = torch.randn(batch, heads, d, generator=g)
    k_slots, v_slots = (torch.randn(blocks * block_size, kv_heads, d, generator=g) * 2 for _ in range(2))
    tables = torch.stack([torch.randperm(blocks, generator=g)[:width] for _ in range(batch)]).int()
    if lens is None:
        lens = torch.randint(1, width * block_size + 1, (batch,), generator=g)
    return q, k_slots, v_slots, tables, torch.tensor(lens).int() if isinstance(lens, list) else lens.int()


@pytest.mark.parametrize("seed,batch,heads,kv_heads,d,block_size", [
    (0, 5, 9, 3, 64, 16),   # SmolLM2's heads: groups of 3
    (1, 3, 4, 4, 32, 8),    # no grouping
    (2, 7, 8, 1, 24, 4),    # one kv head for all (MQA), a head size no vector width divides
    (3, 2, 6, 2, 7, 5),     # odd sizes everywhere
])
def test_each_row_equals_the_reference_to_its_own_length(seed, batch, heads, kv_heads, d, block_size):
    q, k_slots, v_slots, tables, lens = case(seed, batch, heads, kv_heads, d, block_size)
    out = paged_decode_attention_cpu(q, k_slots, v_slots, tables, lens, block_size)
    torch.testing.assert_close(out, spec(q, k_slots, v_slots, tables, lens, block_size), atol=2e-6, rtol=1e-5)


def test_lengths_at_the_edges_of_a_block():
    """One token; a block exactly full; one past it; the whole table."""
    bs = 8
    q, k_slots, v_slots, tables, lens = case(4, 5, 4, 2, 16, bs, lens=[1, bs, bs + 1, 6 * bs - 1, 6 * bs])
    out = paged_decode_attention_cpu(q, k_slots, v_slots, tables, lens, bs)
    torch.testing.assert_close(out, spec(q, k_slots, v_slots, tables, lens, bs), atol=2e-6, rtol=1e-5)
    # one key: the softmax puts all its weight there, so the output is that key's value
    first = tables[0, 0].item() * bs
    torch.testing.assert_close(out[0].view(2, 2, 16), v_slots[first][:, None].expand(2, 2, 16))


def test_only_the_named_rows_are_written_and_a_strided_q_is_read_right():
    """The engine hands q as a split of the rotated q/k heads (rows further apart than heads x d) and asks
    for the decode rows of a mixed batch: the others keep what they held."""
    q, k_slots, v_slots, tables, lens = case(5, 3, 6, 2, 16, 4)
    qk = torch.randn(7, 6 + 2, 16)
    qk[[5, 0, 3], :6] = q
    rows = torch.tensor([5, 0, 3], dtype=torch.int32)
    out = torch.full((7, 6, 16), 7.0)
    paged_decode_attention_cpu(qk[:, :6], k_slots, v_slots, tables, lens, 4, rows=rows, out=out)
    torch.testing.assert_close(out[[5, 0, 3]], spec(q, k_slots, v_slots, tables, lens, 4), atol=2e-6, rtol=1e-5)
    assert (out[[1, 2, 4, 6]] == 7.0).all()


@pytest.mark.parametrize("gain", [50.0, 3.0])
def test_large_scores_neither_overflow_nor_lose_their_small_terms(gain):
    """x50: scores in the thousands (exp without the max subtracted would be inf) and most terms below
    float32's range after it (the kernel's vector exp returns 0 there); x3: terms spread over many decades, where
    an inexact exp would show. Scores that large carry float32 rounding of their own, so the kernel is held to
    the float64 answer as closely as PyTorch's own float32 attention is."""
    q, k_slots, v_slots, tables, lens = case(6, 3, 4, 2, 32, 8)
    q, k_slots = q * gain, k_slots * gain
    out = paged_decode_attention_cpu(q, k_slots, v_slots, tables, lens, 8)
    assert torch.isfinite(out).all()
    exact = spec(q.double(), k_slots.double(), v_slots.double(), tables, lens, 8)
    torch_error = (spec(q, k_slots, v_slots, tables, lens, 8) - exact).abs().max().item()
    assert (out - exact).abs().max().item() <= 2 * torch_error + 1e-6


@pytest.mark.parametrize("change,message", [
    (lambda a: a.update(tables=a["tables"].clone().fill_(40)), "names a block outside the pool's 40"),
    (lambda a: a.update(lens=a["lens"] + 1000), "longer than its block table holds"),
    (lambda a: a.update(rows=torch.tensor([0, 1, 3], dtype=torch.int32)), "a row is outside q's 3"),
    (lambda a: a.update(q=a["q"].double()), "float32 CPU tensors only"),
    (lambda a: a.update(q=a["q"][:, :5]), "kv_heads dividing heads"),
    (lambda a: a.update(out=torch.empty(3, 6, 16).transpose(0, 1)), "out must be contiguous"),
])
def test_bad_input_is_refused_in_words_before_anything_is_read(change, message):
    q, k_slots, v_slots, tables, lens = case(7, 3, 6, 2, 16, 4)
    args = dict(q=q, k_slots=k_slots, v_slots=v_slots, tables=tables, lens=lens, rows=None, out=None)
    change(args)
    with pytest.raises(ValueError, match=message):
        paged_decode_attention_cpu(args["q"], args["k_slots"], args["v_slots"], args["tables"], args["lens"], 4,
                                   rows=args["rows"], out=args["out"])


PROMPTS = ["def fibonacci(n):", "The capital of", "x = [1, 2, 3]\nfor", "import torch\n" * 5 + "def",
           "a", "def fibonacci(n):\n    if n < 2:"]


@pytest.mark.parametrize("block_size", [16, 4])
def test_the_engine_with_the_kernel_makes_the_tokens_of_the_gather_path(block_size):
    """Prompts of many lengths (prefills and decodes in one step, shared prefixes, the last block partial),
    greedy: the kernel and the gather path give the same tokens, and the engine did use the kernel."""
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    outputs = {}
    for kernel in (True, False):
        llm = LLM("tiny", cpu_decode_kernel=kernel, block_size=block_size, max_num_seqs=4,
                  max_num_batched_tokens=64)
        assert llm.engine.view.uses_cpu_decode_kernel is kernel
        outputs[kernel] = [o.token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)]
    assert outputs[True] == outputs[False]


def test_the_kernel_stays_out_where_it_cannot_run():
    """compile_decode traces the gather path; tensor parallelism rebuilds it on every rank; bfloat16 has no kernel."""
    from minillm.config import EngineConfig
    from minillm.engine.engine import LLMEngine
    for config in (EngineConfig.from_knobs("tiny", cpu_decode_kernel=False), EngineConfig("tiny", dtype="bfloat16")):
        assert not LLMEngine(config).view.uses_cpu_decode_kernel
    with pytest.raises(TypeError, match="cpu_decode_kernel must be True or False"):
        EngineConfig.from_knobs("tiny", cpu_decode_kernel="yes")


def test_the_step_store_writes_each_new_key_and_value_to_its_slot_and_nothing_else():
    """store_and_launch (the engine's one call a layer): k and v come as splits of one product, rows further
    apart than their heads; it writes them where index_copy_ would, then attends over them."""
    q, k_slots, v_slots, tables, lens = case(8, 2, 4, 2, 8, 4)
    lens = torch.tensor([5, 9], dtype=torch.int32)
    slots = torch.stack([tables[0, 1].long() * 4 + 0, tables[1, 2].long() * 4 + 0])  # token 4 of row 0, 8 of row 1
    qkv = torch.randn(2, (4 + 2 + 2) * 8)
    k, v = qkv[:, 32:48].view(2, 2, 8), qkv[:, 48:].view(2, 2, 8)
    expected_k, expected_v = k_slots.clone().index_copy_(0, slots, k), v_slots.clone().index_copy_(0, slots, v)
    out = torch.empty(2, 4, 8)
    paged_decode_cpu.store_and_launch(k, v, slots, q, k_slots, v_slots, tables, lens, torch.arange(2).int(), 4, out)
    assert torch.equal(k_slots, expected_k) and torch.equal(v_slots, expected_v)
    torch.testing.assert_close(out, spec(q, k_slots, v_slots, tables, lens, 4), atol=2e-6, rtol=1e-5)
