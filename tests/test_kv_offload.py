"""The KV offload tier: blocks leave the pool and come back bit-identical, a session's next call
restores its whole prefix after others filled the pool, and the tier keeps its capacity (LRU)."""
import inspect
import json

import pytest
import torch

from minillm import LLM, SamplingParams
from minillm.cache.offload import OffloadStore

GREEDY = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
BS = 16


@pytest.fixture(scope="module")
def corpus():
    return LLM("tiny", num_kv_blocks=4).tokenizer.encode(inspect.getsource(json.decoder))


@pytest.fixture(scope="module")
def unpressured():
    """The reference: a pool big enough for everything, no tier."""
    return LLM("tiny", num_kv_blocks=200)


@pytest.mark.parametrize("kind", ["host", "disk"])
def test_offloaded_blocks_come_back_bit_identical(kind, tmp_path):
    llm = LLM("tiny", num_kv_blocks=8)
    pool = llm.engine.cache.pool
    gen = torch.Generator().manual_seed(0)
    pool.k.copy_(torch.randn(pool.k.shape, generator=gen) * 1e3)  # both signs, every exponent range
    pool.v.copy_(torch.randn(pool.v.shape, generator=gen) * 1e-3)
    before = pool.read_blocks([3, 5])
    store = OffloadStore(pool, kind, 4, tmp_path if kind == "disk" else None)
    assert store.save([(3, 111, None, (1,) * BS), (5, 222, 111, (2,) * BS)]) == 2
    pool.k.zero_()
    pool.v.zero_()
    store.restore([111, 222], [7, 0])
    after_k, after_v = pool.read_blocks([7, 0])
    for layer in range(pool.k.shape[0]):
        assert torch.equal(after_k[layer], before[0][layer]) and torch.equal(after_v[layer], before[1][layer])
    assert pool.read_blocks([3])[0].abs().sum() == 0  # only the target blocks were written
    if kind == "disk":  # the file itself holds the bytes: read it back through a separate mapping
        on_disk = torch.from_file(str(store.path), shared=False, size=store.slots.numel(), dtype=pool.k.dtype)
        assert torch.equal(on_disk.view(store.slots.shape), store.slots)
        assert store.path.parent == tmp_path


def test_tier_keeps_its_capacity_and_evicts_the_least_recently_used():
    pool = LLM("tiny", num_kv_blocks=8).engine.cache.pool
    store = OffloadStore(pool, "host", 4)
    chain = [(b, 10 + b, None if b == 0 else 9 + b, (b,) * BS) for b in range(3)]  # names 10, 11, 12
    store.save(chain)
    store.save([(4, 20, None, (4,) * BS), (5, 21, 20, (5,) * BS)])
    # a chain is saved tail first, so each head is the more recent: 12 was the least recent and goes
    assert set(store.entries) == {10, 11, 20, 21} and len(store) == store.capacity
    assert store.find(11, 10, (1,) * BS) and not store.find(11, 99, (1,) * BS)  # the parent is verified
    store.save([(6, 30, None, (6,) * BS)])  # 11 was just used: 10 is now the least recent
    assert set(store.entries) == {11, 20, 21, 30}
    assert store.stats()["evictions"] == 2 and store.stats()["misses"] == 1


def session_call(corpus):
    """A session's first call, and its second: the first's prompt + output + a tool result."""
    return corpus[:90], lambda first_out: corpus[:90] + first_out + corpus[900:920]


def fill_pool(llm, corpus):
    for i in range(3):  # three other requests, more than the pool: every cached block is evicted
        llm.generate([corpus[300 + 100 * i:300 + 100 * i + 110]], GREEDY, use_tqdm=False)


@pytest.mark.parametrize("kind", ["host", "disk"])
def test_next_call_restores_its_whole_prefix_after_the_pool_was_filled(kind, corpus, unpressured, tmp_path):
    first, second = session_call(corpus)
    recompute = LLM("tiny", num_kv_blocks=10)
    offload = LLM("tiny", num_kv_blocks=10)
    store = offload.engine.cache.attach_offload(kind, 32, tmp_path if kind == "disk" else None)
    outs, firsts = {}, {}
    for name, llm in (("recompute", recompute), ("offload", offload)):
        firsts[name] = llm.generate([first], GREEDY, use_tqdm=False)[0].token_ids
        if name == "offload":
            assert llm.engine.offload_prefix(first + firsts[name]) == 5  # (90 + 4 - 1) // 16 blocks computed
            assert llm.engine.kv_stats().cached_blocks == 0
        fill_pool(llm, corpus)
        outs[name] = llm.generate([second(firsts[name])], GREEDY, use_tqdm=False)[0]
    reference = unpressured.generate([second(firsts["offload"])], GREEDY, use_tqdm=False)[0]
    assert outs["recompute"].metrics["cached_prompt_tokens"] == 0  # the pressure is real
    assert outs["offload"].metrics["cached_prompt_tokens"] == 5 * BS
    assert outs["offload"].token_ids == reference.token_ids == outs["recompute"].token_ids
    assert store.stats()["restores"] == 5
    for llm in (recompute, offload):
        assert llm.engine.kv_stats().used_blocks == 0


def test_evicted_blocks_are_saved_and_a_tier_smaller_than_the_prefix_restores_its_head(corpus, unpressured):
    """No offload_prefix call: the pool's evictions alone fill the tier. A 3-block tier keeps only
    part of the 5-block prefix, and what comes back must still give the right output."""
    first, second = session_call(corpus)
    llm = LLM("tiny", num_kv_blocks=10)
    store = llm.engine.cache.attach_offload("host", 3)
    out = llm.generate([first], GREEDY, use_tqdm=False)[0]
    llm.generate([corpus[300:410]], GREEDY, use_tqdm=False)  # 7 blocks: evicts some of the first's 5
    assert store.stats()["offloads"] >= 2 and len(store) <= 3
    fill_pool(llm, corpus)
    assert len(store) == 3
    again = llm.generate([second(out.token_ids)], GREEDY, use_tqdm=False)[0]
    reference = unpressured.generate([second(out.token_ids)], GREEDY, use_tqdm=False)[0]
    assert again.token_ids == reference.token_ids
    assert again.metrics["cached_prompt_tokens"] % BS == 0 and again.metrics["cached_prompt_tokens"] <= 3 * BS
    assert llm.engine.kv_stats().used_blocks == 0 and len(store) <= 3


def test_offload_without_a_tier_is_refused_by_name():
    llm = LLM("tiny", num_kv_blocks=8)
    with pytest.raises(ValueError, match="attach_offload"):
        llm.engine.offload_prefix([1, 2, 3])
    with pytest.raises(ValueError, match="kind must be one of host, disk, got 'ssd'"):
        llm.engine.cache.attach_offload("ssd", 4)
    with pytest.raises(ValueError, match="capacity must be a positive number of blocks, got 0"):
        llm.engine.cache.attach_offload("host", 0)
