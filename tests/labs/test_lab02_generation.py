"""Grader of lab 02, generation and the KV cache. Oracles: minillm's model, cache and sampler."""
from functools import cache

import torch

from minillm import LLM, SamplingParams
from minillm.cache.contiguous import ContiguousContext, ContiguousKVCache
from minillm.state import RequestMetrics
from minillm.labkit import exercise
from minillm.labkit.fixtures import assert_close, randn
from minillm.layers.attention import AttentionContext
from minillm.sampling import top_k_filter, top_p_filter

EXERCISES = {"2.1": "KVCache", "2.2": "forward_step", "2.3": "top_k_filter", "2.4": "top_p_filter",
             "2.5": "sample", "2.6": "generate", "2.7": "latency_metrics"}


@cache
def llm() -> LLM:
    return LLM("tiny")


def prompt(n: int, seed: int) -> torch.Tensor:
    return torch.randint(1, llm().model.config.vocab_size, (n,), generator=torch.Generator().manual_seed(seed))


class ReferenceCache(AttentionContext):
    """minillm's contiguous cache behind the lab's interface (`length`, advanced by the caller)."""

    def __init__(self, cfg, max_len: int) -> None:
        self.cache, self.length = ContiguousKVCache(cfg, max_len, torch.float32, torch.device("cpu")), 0

    def attend(self, layer_idx, q, k, v):
        return ContiguousContext([self.cache], [q.shape[0]], [self.length]).attend(layer_idx, q, k, v)


@torch.no_grad()
def run_chunks(model, kv, ids: torch.Tensor, chunks: list[int]) -> torch.Tensor:
    """Feed ids chunk by chunk through `kv` at the right positions; -> logits of every token."""
    out, start = [], 0
    for n in chunks:
        positions = torch.arange(start, start + n)
        out.append(model.compute_logits(model(ids[start:start + n], positions, kv)))
        kv.length, start = kv.length + n, start + n
    return torch.cat(out)


@exercise("2.1")
def test_cache_prefill_then_decode_matches_full_forward(lab):
    """prefill 9 tokens, a chunk of 3, then 2 single decodes through the cache = one full forward"""
    model, ids = llm().model, prompt(14, 201)
    logits = run_chunks(model, lab.KVCache(model.config, 20), ids, [9, 3, 1, 1])
    assert_close(logits, llm().logits(ids), "logits through your cache vs without a cache", atol=1e-3)


@exercise("2.1")
def test_cache_stores_each_layers_keys_at_their_positions(lab):
    """after 6 + 1 tokens, k and v hold each layer's keys and values at positions 0..6"""
    model, ids = llm().model, prompt(7, 202)
    mine, ref = lab.KVCache(model.config, 12), ReferenceCache(model.config, 12)
    run_chunks(model, mine, ids, [6, 1])
    run_chunks(model, ref, ids, [6, 1])
    for layer in range(model.config.num_hidden_layers):
        keys, values = ref.cache.view(layer, 7)  # [7, kv_heads, head_dim]
        assert_close(mine.k[layer, :7], keys, f"KVCache.k[{layer}, :7]", atol=1e-4)
        assert_close(mine.v[layer, :7], values, f"KVCache.v[{layer}, :7]", atol=1e-4)


@exercise("2.1")
def test_cache_refuses_tokens_beyond_its_capacity(lab):
    """attending more tokens than max_len raises ValueError instead of writing out of bounds"""
    model = llm().model
    kv = lab.KVCache(model.config, 5)
    try:
        run_chunks(model, kv, prompt(6, 203), [4, 2])
    except ValueError:
        return
    raise AssertionError("6 tokens went into a cache of max_len 5 without a ValueError")


@exercise("2.2")
def test_forward_step_decodes_at_offset_positions(lab):
    """prefill 8 tokens then 3 decode steps = the full forward's logits for the same tokens"""
    model, ids = llm().model, prompt(11, 204)
    kv = ReferenceCache(model.config, 16)
    with torch.no_grad():
        steps = [lab.forward_step(model, ids[:8], kv)] + [lab.forward_step(model, ids[i:i + 1], kv) for i in range(8, 11)]
    assert kv.length == 11, f"cache.length is {kv.length} after 11 tokens"
    assert_close(torch.cat(steps).float(), llm().logits(ids), "logits of prefill + 3 decode steps", atol=1e-3)


def rows(seed: int, batch: int = 4, vocab: int = 40) -> torch.Tensor:
    return randn(seed, batch, vocab, scale=2.0)


def reference_filter(logits: torch.Tensor, top_k: int, top_p: float, temperature: float = 1.0) -> torch.Tensor:
    return top_p_filter(top_k_filter(logits / temperature, top_k), top_p)


@exercise("2.3")
def test_top_k_keeps_the_k_largest_of_each_row(lab):
    """each row keeps its own k largest logits (values unchanged), the rest become -inf"""
    logits = rows(211)
    for k in (1, 3, 17):
        assert_close(lab.top_k_filter(logits, k), reference_filter(logits, k, 1.0), f"top_k_filter(k={k})")


@exercise("2.3")
def test_top_k_zero_disables_the_filter(lab):
    """k = 0 leaves the logits as they are"""
    logits = rows(212)
    assert_close(lab.top_k_filter(logits, 0), logits, "top_k_filter(k=0)")


@exercise("2.4")
def test_top_p_keeps_the_token_that_crosses_the_threshold(lab):
    """with probabilities .5 .3 .2 and p = .6 the first two tokens stay (.5 alone is below p)"""
    logits = torch.tensor([[0.5, 0.2, 0.3], [0.2, 0.3, 0.5]]).log()
    kept = lab.top_p_filter(logits, 0.6).isfinite()
    expected = torch.tensor([[True, False, True], [False, True, True]])
    assert torch.equal(kept, expected), f"kept {kept.tolist()}, expected {expected.tolist()}"


@exercise("2.4")
def test_top_p_matches_reference_per_row(lab):
    """each row keeps its own nucleus, for several p, kept logits unchanged"""
    logits = rows(213)
    for p in (0.05, 0.5, 0.9, 1.0):
        assert_close(lab.top_p_filter(logits, p), reference_filter(logits, 0, p), f"top_p_filter(p={p})")


def frequencies(tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    return torch.bincount(tokens.reshape(-1), minlength=vocab).float() / tokens.numel()


@exercise("2.5")
def test_sample_greedy_is_the_argmax_of_each_row(lab):
    """temperature 0 returns each row's argmax as a [batch] tensor of ints"""
    logits = rows(221, batch=5)
    tokens = lab.sample(logits, 0.0, 0, 1.0, torch.Generator().manual_seed(1))
    assert torch.equal(torch.as_tensor(tokens).reshape(-1), logits.argmax(-1)), "greedy tokens are not the argmax"


@exercise("2.5")
def test_sample_draws_from_the_tempered_filtered_distribution(lab):
    """token frequencies over 20000 rows match softmax(filtered(logits / T)) for several settings"""
    row = torch.tensor([2.0, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0])
    for temperature, top_k, top_p in ((0.5, 0, 1.0), (1.7, 0, 1.0), (1.0, 4, 1.0), (0.8, 0, 0.85)):
        tokens = lab.sample(row.expand(20000, -1), temperature, top_k, top_p, torch.Generator().manual_seed(2))
        expected = reference_filter(row[None], top_k, top_p, temperature)[0].softmax(-1)
        got = frequencies(torch.as_tensor(tokens), len(row))
        err = (got - expected).abs().max().item()
        assert err < 0.02, (f"with temperature {temperature}, top_k {top_k}, top_p {top_p} the token "
                            f"frequencies are off by up to {err:.3f}")


@exercise("2.5")
def test_sample_is_reproducible_from_the_generator(lab):
    """two generators with one seed give the same tokens; another seed gives others"""
    logits = rows(222, batch=64)

    def draw(seed):
        return torch.as_tensor(lab.sample(logits, 1.0, 0, 1.0, torch.Generator().manual_seed(seed)))
    assert torch.equal(draw(5), draw(5)), "the same seed gave different tokens"
    assert not torch.equal(draw(5), draw(6)), "different seeds gave the same 64 tokens"


class CountingModel(torch.nn.Module):
    """Wraps the model and records how many tokens each forward call processes."""

    def __init__(self, model) -> None:
        super().__init__()
        self.inner, self.config, self.calls = model, model.config, []

    def forward(self, input_ids, positions, ctx=None):
        self.calls.append(input_ids.shape[0])
        return self.inner(input_ids, positions, ctx)

    def compute_logits(self, hidden):
        return self.inner.compute_logits(hidden)


@exercise("2.6")
def test_generate_greedy_matches_minillm(lab):
    """greedy generation of 12 tokens gives minillm's tokens"""
    ids = prompt(10, 231).tolist()
    expected = llm().generate([ids], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))[0].token_ids
    got = list(lab.generate(llm().model, ids, 12))
    assert got == expected, f"greedy tokens {got} differ from minillm's {expected}"


@exercise("2.6")
def test_generate_prefills_once_then_feeds_one_token_per_step(lab):
    """the model sees the prompt once, then one new token per decode step"""
    model, ids = CountingModel(llm().model), prompt(9, 232).tolist()
    lab.generate(model, ids, 5)
    assert model.calls == [9, 1, 1, 1, 1], f"tokens per forward call: {model.calls}, expected [9, 1, 1, 1, 1]"


@exercise("2.6")
def test_generate_sampling_is_seeded(lab):
    """sampling with temperature 1: the same seed repeats the tokens, another seed changes them"""
    ids = prompt(6, 233).tolist()
    first, again = (list(lab.generate(llm().model, ids, 8, temperature=1.0, seed=3)) for _ in range(2))
    other = list(lab.generate(llm().model, ids, 8, temperature=1.0, seed=4))
    assert first == again, "the same seed gave different tokens"
    assert first != other, "seeds 3 and 4 gave the same 8 sampled tokens"


@exercise("2.7")
def test_latency_metrics_follow_the_serving_definitions(lab):
    """TTFT = first token - arrival; TPOT = (last - first) / (tokens - 1)"""
    arrival, times = 10.0, [10.35, 10.41, 10.50, 10.52, 10.70]
    ref = RequestMetrics(arrival, token_times=times)
    ttft, tpot = lab.latency_metrics(arrival, times)
    assert abs(ttft - ref.ttft) < 1e-9, f"TTFT is {ttft}, expected {ref.ttft}"
    assert abs(tpot - ref.tpot) < 1e-9, f"TPOT is {tpot}, expected {ref.tpot}"


@exercise("2.7")
def test_latency_metrics_of_a_single_token_have_no_tpot(lab):
    """one output token: TTFT is defined, TPOT is None"""
    ttft, tpot = lab.latency_metrics(1.0, [1.25])
    assert abs(ttft - 0.25) < 1e-9 and tpot is None, f"got TTFT {ttft}, TPOT {tpot}; expected 0.25 and None"
