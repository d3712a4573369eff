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
    assert [o.token_ids for o in paged.generate(batch, params)] == [o.token_ids for o in contiguous.generate(batch, params)]
    assert paged.engine.kv_stats().used_blocks == 0


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
    assert llm.engine.kv_stats().prefix_hit_rate > 0


def test_forced_hash_collision_never_reuses_wrong_blocks(hf_llama):
    llm = LLM(str(hf_llama[0]), block_size=4, components=Components(hash_fn=lambda parent, tokens: 7))  # all collide
    params = SamplingParams(max_tokens=10, **GREEDY)
    first, second = prompts([20, 20], seed=2)
    llm.generate([first], params)
    out = llm.generate([second], params)[0]
    reference = LLM(str(hf_llama[0]), enable_prefix_caching=False).generate([second], params)[0]
    assert out.token_ids == reference.token_ids
    assert out.metrics["cached_prompt_tokens"] == 0 and llm.engine.kv_stats().prefix_collisions >= 1


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
    assert llm.engine.kv_stats().used_blocks == 0


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
    second = LLMEngine(EngineConfig(model=str(hf_llama[0]), block_size=4), model=first.model)
    assert second.model is first.model
    seen = []
    second.subscribe(seen.append)
    second.add_request([1, 2, 3], SamplingParams(max_tokens=2))
    second.step()
    second.unsubscribe(seen.append)
    second.step()
    assert len(seen) == 1
