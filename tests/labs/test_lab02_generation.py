"""Grader of lab 02, generation and the KV cache. Oracles: minillm's model, cache, sampler and engine;
Hugging Face's logits warpers for the filters. Inputs reach the boundaries the docstrings name: a cache
filled to its last position and one token past it, top-k ties and k at or past the vocabulary, top-p
exactly on a partial sum, logits in the hundreds (low temperatures), one-token prompts. The sampler's
draw is fixed by its docstring (one torch.multinomial call with the request's generator), because the
engine's tokens are compared token for token; its distribution is checked on its own as well.
Small tensors run on one torch thread (on a busy machine more threads only wait)."""
import random
from functools import cache

import torch

from minillm import LLM, SamplingParams
from minillm.cache.contiguous import ContiguousContext, ContiguousKVCache
from minillm.labkit import exercise
from minillm.labkit.endtoend import check_against_reference
from minillm.labkit.fixtures import assert_close, one_thread, randn
from minillm.labkit.plug import lab_components
from minillm.layers.attention import AttentionContext
from minillm.sampling import sample as reference_sample
from minillm.sequence import RequestMetrics

EXERCISES = {"2.1": "KVCache", "2.2": "forward_step", "2.3": "top_k_filter", "2.4": "top_p_filter",
             "2.5": "sample", "2.6": "generate", "2.7": "latency_metrics", "2.E": "your sampler in the real engine"}


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
    with one_thread():
        model, ids = llm().model, prompt(14, 201)
        logits = run_chunks(model, lab.KVCache(model.config, 20), ids, [9, 3, 1, 1])
        assert_close(logits, llm().logits(ids), "logits through your cache vs without a cache", atol=1e-3)


@exercise("2.1")
def test_cache_stores_each_layers_keys_at_their_positions(lab):
    """after 6 + 1 tokens, k and v hold each layer's keys and values at positions 0..6"""
    with one_thread():
        model, ids = llm().model, prompt(7, 202)
        mine, ref = lab.KVCache(model.config, 12), ReferenceCache(model.config, 12)
        run_chunks(model, mine, ids, [6, 1])
        run_chunks(model, ref, ids, [6, 1])
        for layer in range(model.config.num_hidden_layers):
            keys, values = ref.cache.view(layer, 7)  # [7, kv_heads, head_dim]
            assert_close(mine.k[layer, :7], keys, f"KVCache.k[{layer}, :7]", atol=1e-4)
            assert_close(mine.v[layer, :7], values, f"KVCache.v[{layer}, :7]", atol=1e-4)


@exercise("2.1")
def test_cache_holds_exactly_max_len_positions(lab):
    """a cache of max_len 9 takes 6 + 2 + 1 tokens, up to its last position, and gives the full forward's logits"""
    with one_thread():
        model, ids = llm().model, prompt(9, 205)
        logits = run_chunks(model, lab.KVCache(model.config, 9), ids, [6, 2, 1])
        assert_close(logits, llm().logits(ids), "logits through a cache filled to its last position", atol=1e-3)


@exercise("2.1")
def test_cache_refuses_tokens_beyond_its_capacity(lab):
    """attending more tokens than max_len raises ValueError instead of writing out of bounds: a chunk that
    overflows, a prompt longer than the cache, one decode into a full cache"""
    with one_thread():
        model = llm().model
        for chunks, what in (([4, 2], "4 then 2 tokens"), ([6], "a 6-token prompt"), ([5, 1], "5 then 1 token")):
            kv = lab.KVCache(model.config, 5)
            try:
                run_chunks(model, kv, prompt(6, 203), chunks)
            except ValueError:
                continue
            raise AssertionError(f"{what} went into a cache of max_len 5 without a ValueError")


@exercise("2.2")
def test_forward_step_decodes_at_offset_positions(lab):
    """prefill 8 tokens then 3 decode steps = the full forward's logits for the same tokens"""
    with one_thread():
        model, ids = llm().model, prompt(11, 204)
        kv = ReferenceCache(model.config, 16)
        with torch.no_grad():
            steps = [lab.forward_step(model, ids[:8], kv)]
            steps += [lab.forward_step(model, ids[i:i + 1], kv) for i in range(8, 11)]
        assert kv.length == 11, f"cache.length is {kv.length} after 11 tokens"
        assert_close(torch.cat(steps).float(), llm().logits(ids), "logits of prefill + 3 decode steps", atol=1e-3)


def rows(seed: int, batch: int = 4, vocab: int = 40, scale: float = 2.0) -> torch.Tensor:
    """[batch, vocab] logits of both signs, never square."""
    return randn(seed, batch, vocab, scale=scale)


@cache
def warpers():
    """Hugging Face's logits warpers: the independent reference for the filters."""
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper
    return TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper


def hf_filter(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0, temperature: float = 1.0) -> torch.Tensor:
    """Temperature, then top-k, then top-p, by Hugging Face's warpers (0 / 1.0 switch a filter off)."""
    temp, top_k_warper, top_p_warper = warpers()
    z = temp(temperature)(None, logits.clone())
    if top_k:
        z = top_k_warper(top_k)(None, z)
    return top_p_warper(top_p)(None, z) if top_p < 1.0 else z


def random_cases(first_seed: int, count: int):
    """Seeded [batch, vocab] logits of varied shapes (batch 2..6, vocab 11..60, never square)."""
    for i in range(count):
        seed = first_seed + i
        batch, vocab = 2 + i % 5, 11 + (7 * i) % 50
        yield seed, rows(seed, batch, vocab if vocab != batch else vocab + 1, scale=(0.5, 2.0, 6.0)[i % 3])


@exercise("2.3")
def test_top_k_matches_hugging_face_on_random_rows(lab):
    """each row keeps its own k largest logits (values unchanged), as TopKLogitsWarper does, for random rows and k"""
    with one_thread():
        for seed, logits in random_cases(2300, 24):
            vocab = logits.shape[-1]
            for k in (1, 2, 5, vocab - 1):
                assert_close(lab.top_k_filter(logits, k), hf_filter(logits, top_k=k),
                             f"top_k_filter(k={k}) on seeded rows {tuple(logits.shape)} (seed {seed})")


@exercise("2.3")
def test_top_k_keeps_every_logit_tied_with_the_kth(lab):
    """logits tied with the k-th largest all stay, as TopKLogitsWarper keeps them"""
    fixed = torch.tensor([[3.0, 1.0, 1.0, -2.0, 1.0, 0.5, -1.0], [0.0, 0.0, 0.0, 0.0, -1.0, 2.0, 0.0]])
    assert_close(lab.top_k_filter(fixed, 2), hf_filter(fixed, top_k=2), "top_k_filter(k=2) with three-way ties")
    with one_thread():
        for seed in range(2310, 2320):
            logits = torch.randint(-3, 4, (5, 23), generator=torch.Generator().manual_seed(seed)).float()  # many ties
            for k in (1, 4, 9):
                assert_close(lab.top_k_filter(logits, k), hf_filter(logits, top_k=k),
                             f"top_k_filter(k={k}) on integer logits with ties (seed {seed})")


@exercise("2.3")
def test_top_k_zero_or_at_least_the_vocabulary_keeps_everything(lab):
    """k = 0, k = vocab and k > vocab leave the logits as they are"""
    logits = rows(212, batch=3, vocab=17)
    for k in (0, 17, 40):
        assert_close(lab.top_k_filter(logits, k), logits, f"top_k_filter(k={k}) of a vocabulary of 17")


@exercise("2.4")
def test_top_p_keeps_the_token_that_crosses_the_threshold(lab):
    """with probabilities .5 .3 .2 and p = .6 the first two tokens stay (.5 alone is below p)"""
    logits = torch.tensor([[0.5, 0.2, 0.3], [0.2, 0.3, 0.5]]).log()
    kept = lab.top_p_filter(logits, 0.6).isfinite()
    expected = torch.tensor([[True, False, True], [False, True, True]])
    assert torch.equal(kept, expected), f"kept {kept.tolist()}, expected {expected.tolist()}"


@exercise("2.4")
def test_top_p_matches_hugging_face_on_random_rows(lab):
    """each row keeps its own nucleus, as TopPLogitsWarper does, for random rows and several p"""
    with one_thread():
        for seed, logits in random_cases(2400, 24):
            for p in (0.05, 0.3, 0.6, 0.9, 0.99):
                assert_close(lab.top_p_filter(logits, p), hf_filter(logits, top_p=p),
                             f"top_p_filter(p={p}) on seeded rows {tuple(logits.shape)} (seed {seed})")


@exercise("2.4")
def test_top_p_of_logits_in_the_hundreds_matches_hugging_face(lab):
    """logits shifted by hundreds either way (softmax does not change; exp() overflows or underflows float32)
    and rows spread over hundreds, as low temperatures make them: the nucleus of TopPLogitsWarper"""
    rng = random.Random(2410)
    with one_thread():
        for seed, logits in random_cases(2420, 12):
            shift = rng.choice((-1, 1)) * rng.uniform(150, 900)
            for z, what in ((logits + shift, f"shifted by {shift:.0f}"), (logits / 0.02, "divided by 0.02")):
                for p in (0.3, 0.9):
                    assert_close(lab.top_p_filter(z, p), hf_filter(z, top_p=p),
                                 f"top_p_filter(p={p}) on seeded rows {tuple(logits.shape)} {what} (seed {seed})")


def dyadic_rows() -> torch.Tensor:
    """Rows whose probabilities are exactly 1/2, 1/4, 1/8, 1/16, 1/16 (shuffled per row), plus two
    tokens already filtered out (-inf): every partial sum of them is exact in float32."""
    exact = torch.tensor([1 / 2, 1 / 4, 1 / 8, 1 / 16, 1 / 16, 0.0, 0.0])
    orders = [torch.randperm(7, generator=torch.Generator().manual_seed(s)) for s in (0, 1, 2)]
    logits = torch.stack([exact[order] for order in orders]).log()  # [3, 7]
    probs = logits.softmax(-1)
    sorted_probs = probs.sort(-1, descending=True).values
    exact_sums = torch.tensor([0.5, 0.75, 0.875, 0.9375, 1.0, 1.0, 1.0])
    premise = torch.equal(sorted_probs, exact.expand(3, -1)) and \
        torch.equal(sorted_probs.cumsum(-1), exact_sums.expand(3, -1))
    assert premise, "test premise: softmax and its running sums are not exact in float32 here (not your code)"
    return logits


@exercise("2.4")
def test_top_p_on_an_exact_boundary_keeps_the_token_that_reaches_p(lab):
    """probabilities 1/2 1/4 1/8 1/16 1/16: p = 1/2, 3/4, 7/8 exactly keep 1, 2, 3 tokens; just above, one more"""
    with one_thread():
        logits = dyadic_rows()
        probs = logits.softmax(-1)
        for p, expected in ((0.5, 1), (0.75, 2), (0.875, 3), (0.5 + 2 ** -10, 2), (0.75 + 2 ** -10, 3), (2 ** -10, 1)):
            got = lab.top_p_filter(logits, p)
            kept = got.isfinite()
            counts = kept.sum(-1).tolist()
            assert counts == [expected] * 3, (f"top_p_filter(p={p}) on probabilities 1/2, 1/4, 1/8, 1/16, 1/16 kept "
                                             f"{counts} tokens per row, expected {expected} (the most likely ones)")
            assert torch.equal(kept, probs >= probs.sort(-1, descending=True).values[:, expected - 1:expected]), \
                f"top_p_filter(p={p}) kept {expected} tokens per row, but not the {expected} most likely ones"
            assert_close(got, hf_filter(logits, top_p=p), f"top_p_filter(p={p}) on an exact boundary")


@exercise("2.4")
def test_top_p_of_one_or_more_keeps_everything(lab):
    """p = 1 and p > 1 leave the logits as they are"""
    logits = rows(214, batch=3, vocab=29)
    for p in (1.0, 1.5):
        assert_close(lab.top_p_filter(logits, p), logits, f"top_p_filter(p={p})")


def frequencies(tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    return torch.bincount(tokens.reshape(-1), minlength=vocab).float() / tokens.numel()


@exercise("2.5")
def test_sample_greedy_is_the_argmax_of_each_row(lab):
    """temperature 0 returns each row's argmax as a [batch] tensor of ints, whatever top-k and top-p say"""
    with one_thread():
        for seed, logits in random_cases(2500, 6):
            for top_k, top_p in ((0, 1.0), (3, 0.5)):
                tokens = lab.sample(logits, 0.0, top_k, top_p, torch.Generator().manual_seed(1))
                assert torch.equal(torch.as_tensor(tokens).reshape(-1), logits.argmax(-1)), \
                    f"greedy tokens are not each row's argmax (rows {tuple(logits.shape)}, seed {seed})"


SETTINGS = ((1.0, 0, 1.0), (0.5, 0, 1.0), (1.7, 0, 1.0), (1.0, 4, 1.0), (1.0, 0, 0.85), (0.5, 0, 0.7),
            (2.0, 0, 0.6), (0.8, 3, 0.9), (1.5, 5, 0.5))  # (temperature, top_k, top_p)


@exercise("2.5")
def test_sample_draws_from_the_tempered_filtered_distribution(lab):
    """token frequencies over 20000 rows match Hugging Face's temperature, then top-k, then top-p warpers"""
    row = torch.tensor([2.0, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0])
    with one_thread():
        for temperature, top_k, top_p in SETTINGS:  # 20000 rows: a frequency's standard error is below 0.0036
            tokens = lab.sample(row.expand(20000, -1), temperature, top_k, top_p, torch.Generator().manual_seed(2))
            expected = hf_filter(row[None], top_k, top_p, temperature)[0].softmax(-1)
            got = frequencies(torch.as_tensor(tokens), len(row))
            err = (got - expected).abs().max().item()
            assert err < 0.02, (f"with temperature {temperature}, top_k {top_k}, top_p {top_p} the token "
                                f"frequencies are off by up to {err:.3f}")


@exercise("2.5")
def test_sample_draws_the_engines_tokens_from_the_same_seed(lab):
    """with a generator of the same seed, two draws in a row give minillm.sampling.sample's tokens (the docstring
    fixes the draw: one torch.multinomial over the batch), for random rows, low and high temperatures, top-k and
    top-p; the tokens are an int64 [batch] tensor"""
    settings = SETTINGS + ((0.05, 0, 1.0), (0.1, 8, 0.95))  # low temperatures: logits / T reach the hundreds
    with one_thread():
        for (seed, logits), (temperature, top_k, top_p) in zip(random_cases(2510, 22), settings * 2):
            logits = logits * 8 if temperature < 0.2 else logits
            mine, ref = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
            for draw in ("first", "second"):
                got = lab.sample(logits, temperature, top_k, top_p, mine)
                expected = reference_sample(logits, temperature, top_k, top_p, ref)
                what = (f"{draw} draw with temperature {temperature}, top_k {top_k}, top_p {top_p} on seeded rows "
                        f"{tuple(logits.shape)} (seed {seed})")
                assert isinstance(got, torch.Tensor) and got.shape == expected.shape and got.dtype == torch.int64, \
                    (f"{what}: returns {type(got).__name__} of shape {tuple(getattr(got, 'shape', ()))} and dtype "
                     f"{getattr(got, 'dtype', None)}, expected an int64 tensor [batch] = {tuple(expected.shape)}")
                assert torch.equal(got, expected), \
                    (f"{what}: tokens {got.tolist()}, the engine's sampler drew {expected.tolist()} (the docstring "
                     f"fixes the draw, torch.multinomial(softmax(z), 1, generator=generator), so that one seed gives "
                     f"one sequence of tokens)")


@exercise("2.5")
def test_sample_is_reproducible_from_the_generator(lab):
    """two generators with one seed give the same tokens; another seed gives others"""
    with one_thread():
        logits = rows(222, batch=64)

        def draw(seed):
            return torch.as_tensor(lab.sample(logits, 1.0, 0, 1.0, torch.Generator().manual_seed(seed)))
        assert torch.equal(draw(5), draw(5)), "the same seed gave different tokens"
        assert not torch.equal(draw(5), draw(6)), "different seeds gave the same 64 tokens"


@exercise("2.E", timeout=120)
def test_your_sampler_runs_the_real_engine(lab):
    """the real engine with your sampler gives the reference engine's tokens, greedy and sampled"""
    with one_thread():
        check_against_reference(lab_components(lab, labs=["02"]), sampled=True)


class CountingModel(torch.nn.Module):
    """Wraps the model and records the token ids and positions of each forward call."""

    def __init__(self, model) -> None:
        super().__init__()
        self.inner, self.config, self.calls = model, model.config, []

    def forward(self, input_ids, positions, ctx=None):
        self.calls.append((torch.as_tensor(input_ids).tolist(), torch.as_tensor(positions).tolist()))
        return self.inner(input_ids, positions, ctx)

    def compute_logits(self, hidden):
        return self.inner.compute_logits(hidden)


@exercise("2.6")
def test_generate_greedy_matches_minillm(lab):
    """greedy generation gives minillm's tokens, for 1 and for 12 new tokens, after a prompt of one token too"""
    with one_thread():
        for n, new in ((10, 12), (7, 1), (1, 4)):
            ids = prompt(n, 231 + new).tolist()
            greedy = SamplingParams(max_tokens=new, temperature=0, ignore_eos=True)
            expected = llm().generate([ids], greedy, use_tqdm=False)[0].token_ids
            got = list(lab.generate(llm().model, ids, new))
            assert got == expected, f"greedy tokens {got} differ from minillm's {expected} ({new} new tokens)"


@exercise("2.6")
def test_generate_prefills_once_then_feeds_back_each_sampled_token(lab):
    """the model sees the whole prompt once, then each sampled token alone, in order, at its position"""
    with one_thread():
        for new in (5, 1):
            model, ids = CountingModel(llm().model), prompt(9, 232).tolist()
            out = list(lab.generate(model, ids, new, temperature=1.0, seed=new))
            assert model.calls, "generate never called the model"
            assert model.calls[0] == (ids, list(range(9))), \
                f"{new} new tokens: the first forward call got {model.calls[0]}, not the prompt at positions 0..8"
            decodes = model.calls[1:]
            assert len(decodes) in (new - 1, new), \
                (f"{new} new tokens: {len(decodes)} forward calls after the prefill "
                 f"(tokens per call: {[len(c[0]) for c in model.calls]})")
            expected = [([t], [9 + i]) for i, t in enumerate(out)][:len(decodes)]
            assert decodes == expected, (f"{new} new tokens: decode calls got (tokens, positions) {decodes}, "
                                         f"expected each sampled token alone at its position: {expected}")


@exercise("2.6")
def test_generate_sampling_gives_the_engines_tokens(lab):
    """sampling with a seed gives the tokens the engine draws for the same prompt, settings and seed"""
    with one_thread():
        for n, temperature, top_k, top_p, seed in ((6, 1.0, 0, 1.0, 3), (11, 0.8, 40, 0.9, 17)):
            ids = prompt(n, 233 + seed).tolist()
            params = SamplingParams(max_tokens=10, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                                    ignore_eos=True)
            expected = llm().generate([ids], params, use_tqdm=False)[0].token_ids
            got = list(lab.generate(llm().model, ids, 10, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed))
            assert got == expected, (f"temperature {temperature}, top_k {top_k}, top_p {top_p}, seed {seed}: "
                                     f"tokens {got}, the engine's {expected}")


@exercise("2.6")
def test_generate_sampling_is_seeded(lab):
    """sampling with temperature 1: the same seed repeats the tokens, another seed changes them"""
    with one_thread():
        ids = prompt(6, 233).tolist()
        first, again = (list(lab.generate(llm().model, ids, 8, temperature=1.0, seed=3)) for _ in range(2))
        other = list(lab.generate(llm().model, ids, 8, temperature=1.0, seed=4))
        assert first == again, "the same seed gave different tokens"
        assert first != other, "seeds 3 and 4 gave the same 8 sampled tokens"


@exercise("2.7")
def test_latency_metrics_follow_the_serving_definitions(lab):
    """TTFT and TPOT as the serving convention defines them (the lab's concept section), on fixed and seeded random
    timings"""
    gen = torch.Generator().manual_seed(271)
    cases = [(10.0, [10.35, 10.41, 10.50, 10.52, 10.70]), (0.0, [0.5, 0.75]),
             (2.0, [2.0, 2.25, 2.5]), (4.0, [4.5, 4.5, 4.5])]  # a first token at arrival; tokens in one burst
    for n in (2, 3, 7, 30):
        arrival = float(torch.rand(1, generator=gen)) * 100
        cases.append((arrival, (arrival + torch.rand(n, generator=gen).cumsum(0)).tolist()))
    for arrival, times in cases:
        ref = RequestMetrics(arrival, token_times=times)
        ttft, tpot = lab.latency_metrics(arrival, times)
        what = f"{len(times)} tokens"
        assert abs(ttft - ref.ttft) < 1e-9, f"{what}: TTFT is {ttft}, expected {ref.ttft}"
        assert tpot is not None and abs(tpot - ref.tpot) < 1e-9, f"{what}: TPOT is {tpot}, expected {ref.tpot}"


@exercise("2.7")
def test_latency_metrics_of_a_single_token_have_no_tpot(lab):
    """one output token: TTFT is defined, TPOT is None"""
    for arrival, time in ((1.0, 1.25), (3.5, 4.0)):
        ttft, tpot = lab.latency_metrics(arrival, [time])
        assert abs(ttft - (time - arrival)) < 1e-9 and tpot is None, \
            f"got TTFT {ttft}, TPOT {tpot}; expected {time - arrival} and None"
