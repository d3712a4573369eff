"""The engine on the paged cache: same outputs as the contiguous baseline, prefix reuse, n > 1."""
import pytest
import torch

from minillm import LLM, SamplingParams
from minillm.config import Components

GREEDY = dict(temperature=0, ignore_eos=True)


def prompts(lengths, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(1, 320, (n,), generator=gen).tolist() for n in lengths]


@pytest.fixture(scope="module")
def contiguous(hf_llama):
    return LLM(str(hf_llama[0]), kv_cache="contiguous")


@pytest.mark.parametrize("block_size", [1, 16, 7])
def test_paged_generation_is_token_identical_to_contiguous(block_size, hf_llama, contiguous):
    paged = LLM(str(hf_llama[0]), block_size=block_size, num_kv_blocks=512 // block_size + 8)
    batch = prompts([5, 23, 40])  # 40 spans blocks for every size; 23 is not a multiple of 7 or 16
    params = SamplingParams(max_tokens=30, **GREEDY)
    assert ([o.token_ids for o in paged.generate(batch, params)]
            == [o.token_ids for o in contiguous.generate(batch, params)])
    assert paged.engine.view.kv_stats().used_blocks == 0


def test_prefix_hit_gives_identical_output_and_skips_prefill_tokens(hf_llama):
    llm = LLM(str(hf_llama[0]), block_size=8)
    computed = []
    llm.engine.subscribe(lambda e: computed.append(sum(w.num_tokens for w in e.scheduled if w.phase == "prefill")))
    system = prompts([37], seed=1)[0]
    a, b = system + [5, 6, 7], system + [9, 10]
    params = SamplingParams(max_tokens=12, **GREEDY)
    cold_b = LLM(str(hf_llama[0]), enable_prefix_caching=False).generate([b], params)[0]
    llm.generate([a], params)
    computed.clear()
    warm_b = llm.generate([b], params)[0]
    assert warm_b.token_ids == cold_b.token_ids
    assert warm_b.metrics["cached_prompt_tokens"] == 32  # four full 8-token blocks of the shared 37
    assert computed[0] == len(b) - 32
    assert llm.engine.view.kv_stats().prefix_hit_rate > 0


def test_forced_hash_collision_never_reuses_wrong_blocks(hf_llama):
    llm = LLM(str(hf_llama[0]), block_size=4, components=Components(hash_fn=lambda parent, tokens: 7))  # all collide
    params = SamplingParams(max_tokens=10, **GREEDY)
    first, second = prompts([20, 20], seed=2)
    llm.generate([first], params)
    out = llm.generate([second], params)[0]
    reference = LLM(str(hf_llama[0]), enable_prefix_caching=False).generate([second], params)[0]
    assert out.token_ids == reference.token_ids
    assert out.metrics["cached_prompt_tokens"] == 0 and llm.engine.view.kv_stats().prefix_collisions >= 1


def test_n_samples_share_the_prompt_blocks_and_match_separate_seeded_requests(hf_llama):
    llm = LLM(str(hf_llama[0]), block_size=8)
    prompt = prompts([35], seed=3)[0]  # 4 full blocks + 3 tokens
    used = []
    llm.engine.subscribe(lambda e: used.append(e.kv.used_blocks))
    out = llm.generate([prompt], SamplingParams(max_tokens=6, n=3, temperature=1.0, seed=100, ignore_eos=True))[0]
    # After the first decode step: 4 shared full blocks, plus each sample's own copy of the last one.
    assert used[1] == 4 + 3
    alone = LLM(str(hf_llama[0]), block_size=8, enable_prefix_caching=False)
    separate = [alone.generate([prompt], SamplingParams(max_tokens=6, temperature=1.0, seed=100 + i,
                                                        ignore_eos=True))[0].token_ids for i in range(3)]
    assert [c.token_ids for c in out.outputs] == separate
    assert [c.index for c in out.outputs] == [0, 1, 2]
    assert llm.engine.view.kv_stats().used_blocks == 0


def test_request_that_cannot_fit_the_pool_is_rejected_up_front(hf_llama):
    llm = LLM(str(hf_llama[0]), block_size=16, num_kv_blocks=4)
    with pytest.raises(ValueError, match="could never fit in the KV pool of 4 blocks"):
        llm.generate([[1] * 60], SamplingParams(max_tokens=10))
    assert not llm.engine.has_unfinished()


def test_budget_smaller_than_one_block_is_rejected(hf_llama):
    with pytest.raises(ValueError, match="holds no block"):
        LLM(str(hf_llama[0]), kv_cache_memory=100)


def test_kv_stats_account_for_every_block(hf_llama):
    llm = LLM(str(hf_llama[0]), block_size=4, num_kv_blocks=64)
    events = []
    llm.engine.subscribe(events.append)
    llm.generate([prompts([10])[0]], SamplingParams(max_tokens=5, **GREEDY))
    kv = events[0].kv
    assert kv.used_blocks + kv.cached_blocks + kv.free_blocks == 64
    assert kv.used_blocks == 3 and kv.fragmentation == pytest.approx(1 - 10 / 12)
    assert kv.block_owner.count(events[0].scheduled[0].request_id) == 3


def test_engines_can_share_loaded_weights_and_observers_can_leave(hf_llama):
    from minillm.config import EngineConfig
    from minillm.engine.engine import LLMEngine
    first = LLMEngine(EngineConfig(model=str(hf_llama[0])))
    second = LLMEngine(EngineConfig.from_knobs(str(hf_llama[0]), block_size=4), model=first.model)
    assert second.model is first.model
    seen = []
    second.subscribe(seen.append)
    second.add_request([1, 2, 3], SamplingParams(max_tokens=2))
    second.step()
    second.unsubscribe(seen.append)
    second.step()
    assert len(seen) == 1


@pytest.mark.parametrize("cpu_decode", [True, False], ids=["in place (C++)", "gathered (SDPA over padded blocks)"])
def test_garbage_in_unwritten_slots_never_reaches_attention(cpu_decode, monkeypatch):
    """Decode gathers whole blocks, the unwritten tail of each sequence's last block included, and
    pads shorter rows with the pad block: those slots are masked, and whatever the memory held before
    (NaN, say, from a request that overflowed, or an allocation's old bytes: the pool is not zeroed
    whole) must not reach a sequence. Here every slot of the pool starts as NaN, the pad block's too."""
    from minillm.cache.paged import PagedCacheManager
    from minillm.layers.attention import causal_attention
    from minillm.models.model_config import ModelConfig
    from minillm.sequence import Phase, Sequence
    from minillm.step import ScheduledSeq
    cfg = ModelConfig("LlamaForCausalLM", 64, 32, 64, 1, 6, 2, 8, 128)
    allocate = torch.empty

    def old_bytes(*size, **kwargs):  # memory a previous owner left full of NaN
        memory = allocate(*size, **kwargs)
        return memory.fill_(float("nan")) if memory.is_floating_point() else memory

    with monkeypatch.context() as patch:
        patch.setattr(torch, "empty", old_bytes)
        cache = PagedCacheManager(cfg, 16, 4, torch.float32, torch.device("cpu"), False, cpu_decode=cpu_decode)
    assert cache.pool.k[:, :16 * 4].isnan().all(), "the pool's blocks start as garbage here"
    gen = torch.Generator().manual_seed(0)
    lengths, seqs = [6, 11, 3], []
    for i, n in enumerate(lengths):  # contexts that end mid-block: 2, 3 and 1 blocks of 4
        seq = Sequence(str(i), None, list(range(n)), SamplingParams(), torch.Generator(), None, ())
        assert cache.allocate(seq) == 0
        seq.num_computed_tokens = n - 1
        seqs.append(seq)
    keys = [torch.randn(n, 2, 8, generator=gen) for n in lengths]
    values = [torch.randn(n, 2, 8, generator=gen) for n in lengths]
    for seq, k, v in zip(seqs, keys, values):  # the context, written through the slots as a step would
        slots = [seq.kv.blocks[t // 4] * 4 + t % 4 for t in range(len(k) - 1)]
        cache.pool.k[0, slots], cache.pool.v[0, slots] = k[:-1], v[:-1]
    q = torch.randn(3, 6, 8, generator=gen)
    batch = [ScheduledSeq(seq, 1, Phase.DECODE, True) for seq in seqs]
    out = cache.context(batch).attend(0, q, torch.stack([k[-1] for k in keys]), torch.stack([v[-1] for v in values]))
    assert not out.isnan().any()
    for i, (k, v) in enumerate(zip(keys, values)):
        torch.testing.assert_close(out[i], causal_attention(q[i:i + 1], k, v)[0], atol=1e-5, rtol=1e-5)


def test_copy_tokens_moves_each_token_k_v_between_pools_of_other_block_sizes():
    """copy_tokens (a self draft's start from its target's K/V): token t of the source sequence, read where the
    source's block table puts it, lands where the destination's table puts token t, in every layer; the tail of
    the destination's last block and every other block stay as they were."""
    from minillm.cache.paged import PagedCacheManager
    from minillm.models.model_config import ModelConfig
    from minillm.sequence import Sequence
    cfg = ModelConfig("LlamaForCausalLM", 64, 32, 64, 3, 6, 2, 8, 128)
    source = PagedCacheManager(cfg, 16, 4, torch.float32, torch.device("cpu"), False)
    sink = PagedCacheManager(cfg, 8, 16, torch.float32, torch.device("cpu"), False)
    gen = torch.Generator().manual_seed(0)
    source.pool.k.copy_(torch.randn(source.pool.k.shape, generator=gen))
    source.pool.v.copy_(torch.randn(source.pool.v.shape, generator=gen))
    tokens = list(range(21))  # 6 blocks of 4 there (the last partial), 2 of 16 here
    first = Sequence("a", None, tokens[:5], SamplingParams(), torch.Generator(), None, ())
    assert source.allocate(first) == 0  # blocks 0-1, so that the next sequence's table starts elsewhere
    seq, shadow = (Sequence(str(i), None, tokens, SamplingParams(), torch.Generator(), None, ()) for i in range(2))
    assert source.allocate(seq) == 0 and sink.allocate(shadow) == 0
    sink.pool.k.fill_(7.0)
    sink.pool.v.fill_(7.0)
    n = 19
    sink.copy_tokens(source, seq, shadow, n)
    for t in range(n):
        here, there = shadow.kv.blocks[t // 16] * 16 + t % 16, seq.kv.blocks[t // 4] * 4 + t % 4
        assert torch.equal(sink.pool.k[:, here], source.pool.k[:, there])
        assert torch.equal(sink.pool.v[:, here], source.pool.v[:, there])
    written = torch.zeros(sink.pool.k.shape[1], dtype=torch.bool)
    written[[shadow.kv.blocks[t // 16] * 16 + t % 16 for t in range(n)]] = True
    assert (sink.pool.k[:, ~written] == 7.0).all() and (sink.pool.v[:, ~written] == 7.0).all()
