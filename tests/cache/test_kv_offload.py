"""The KV offload tier: blocks leave the pool and come back bit-identical, a session's next call
restores its whole prefix after others filled the pool, and the tier keeps its capacity (LRU)."""
import inspect
import json

import pytest
import torch

from minillm import LLM, SamplingParams
from minillm.cache.offload import OffloadStore
from minillm.cache.pool import PagedKVPool

GREEDY = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
LOGPROBS = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True, logprobs=5)
BS = 16


@pytest.fixture(scope="module")
def corpus():
    return LLM("tiny", num_kv_blocks=4).tokenizer.encode(inspect.getsource(json.decoder))


@pytest.fixture
def unpressured():
    """The reference: a pool big enough for everything, no tier (fresh per test: nothing cached yet)."""
    return LLM("tiny", block_size=8, num_kv_blocks=200)


def small_pool() -> PagedKVPool:
    """An 8-block pool shaped for tiny (6 layers, 4 KV heads of 32)."""
    return PagedKVPool(LLM("tiny", num_kv_blocks=1).engine.model_config, 8, BS, torch.float32, torch.device("cpu"))


@pytest.mark.parametrize("kind", ["host", "disk"])
def test_offloaded_blocks_come_back_bit_identical(kind, tmp_path):
    pool = small_pool()
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
    pool = small_pool()
    store = OffloadStore(pool, "host", 4)
    chain = [(b, 10 + b, None if b == 0 else 9 + b, (b,) * BS) for b in range(3)]  # names 10, 11, 12
    store.save(chain)
    store.save([(4, 20, None, (4,) * BS), (5, 21, 20, (5,) * BS)])
    # a chain is saved tail first, so each head is the more recent: 12 was the least recent and goes
    assert set(store.entries) == {10, 11, 20, 21} and len(store) == store.capacity
    assert store.holds(11, 10, (1,) * BS) and not store.holds(11, 99, (1,) * BS)  # the parent is verified
    store.save([(6, 30, None, (6,) * BS)])  # a lookup alone uses nothing: 11, the least recent, goes
    assert set(store.entries) == {10, 20, 21, 30} and store.stats()["misses"] == 0
    store.looked_up([10], missed=True)  # an allocation went ahead with 10, then found no next block
    store.save([(7, 40, None, (7,) * BS)])  # 10 was just used: 21 is now the least recent
    assert set(store.entries) == {10, 20, 30, 40}
    assert store.stats()["evictions"] == 3 and store.stats()["misses"] == 1


SMALL = dict(block_size=8, num_kv_blocks=12)  # 96 tokens: one other request fills it


def session_call(corpus):
    """A session's first call, and its second: the first's prompt + output + a tool result."""
    return corpus[:40], lambda first_out: corpus[:40] + first_out + corpus[900:916]


def fill_pool(llm, corpus):
    for i in range(2):  # two other requests of 10 blocks each: every cached block is evicted
        llm.generate([corpus[300 + 100 * i:380 + 100 * i]], GREEDY, use_tqdm=False)


@pytest.mark.parametrize("kind", ["host", "disk"])
def test_next_call_restores_its_whole_prefix_after_the_pool_was_filled(kind, corpus, unpressured, tmp_path):
    first, second = session_call(corpus)
    variants = {"offload": LLM("tiny", **SMALL)}
    if kind == "host":  # once is enough to show that the pressure is real
        variants["recompute"] = LLM("tiny", **SMALL)
    variants["offload"].engine.kv_offload.attach(kind, 32, tmp_path if kind == "disk" else None)
    outs, firsts = {}, {}
    for name, llm in variants.items():
        firsts[name] = llm.generate([first], GREEDY, use_tqdm=False)[0].token_ids
        if name == "offload":
            assert llm.engine.kv_offload.offload_prefix(first + firsts[name]) == 5  # (40 + 4 - 1) // 8 blocks computed
            assert llm.engine.view.kv_stats().cached_blocks == 0
        fill_pool(llm, corpus)
        outs[name] = llm.generate([second(firsts[name])], LOGPROBS, use_tqdm=False)[0]
        assert llm.engine.view.kv_stats().used_blocks == 0
    unpressured.generate([first], GREEDY, use_tqdm=False)  # computes the prefix blocks as the first call did
    reference = unpressured.generate([second(firsts["offload"])], LOGPROBS, use_tqdm=False)[0]
    assert outs["offload"].metrics["cached_prompt_tokens"] == reference.metrics["cached_prompt_tokens"] == 5 * 8
    # the same 40 cached tokens, the same 20 computed on top: restored K/V equal to the computed ones
    # give the same logits to the last bit (a wrong block order or slot would not)
    assert outs["offload"].token_ids == reference.token_ids
    assert outs["offload"].outputs[0].logprobs == reference.outputs[0].logprobs
    assert variants["offload"].engine.kv_offload.stats()["restores"] == 5
    if "recompute" in outs:
        assert outs["recompute"].metrics["cached_prompt_tokens"] == 0
        assert outs["recompute"].token_ids == reference.token_ids


def test_evicted_blocks_are_saved_and_a_tier_smaller_than_the_prefix_restores_its_head(corpus, unpressured):
    """No offload_prefix call: the pool's evictions alone fill the tier. A 3-block tier keeps only
    part of the 5-block prefix, and what comes back must still give the right output."""
    first, second = session_call(corpus)
    llm = LLM("tiny", **SMALL)
    llm.engine.kv_offload.attach("host", 3)
    out = llm.generate([first], GREEDY, use_tqdm=False)[0]
    fill_pool(llm, corpus)
    assert llm.engine.kv_offload.stats()["offloads"] >= 5 and llm.engine.kv_offload.stats()["blocks"] == 3
    again = llm.generate([second(out.token_ids)], GREEDY, use_tqdm=False)[0]
    reference = unpressured.generate([second(out.token_ids)], GREEDY, use_tqdm=False)[0]
    assert again.token_ids == reference.token_ids
    assert again.metrics["cached_prompt_tokens"] % 8 == 0 and again.metrics["cached_prompt_tokens"] <= 3 * 8
    assert llm.engine.view.kv_stats().used_blocks == 0 and llm.engine.kv_offload.stats()["blocks"] == 3


def test_offload_without_a_tier_is_refused_by_name():
    llm = LLM("tiny", num_kv_blocks=8)
    with pytest.raises(ValueError, match=r"call kv_offload\.attach\(kind, capacity\) first"):
        llm.engine.kv_offload.offload_prefix([1, 2, 3])
    with pytest.raises(ValueError, match="KV offload needs kv_cache='paged', got 'contiguous'"):
        LLM("tiny", kv_cache="contiguous").engine.kv_offload.attach("host", 4)
    with pytest.raises(ValueError, match="kind must be one of host, disk, got 'ssd'"):
        llm.engine.kv_offload.attach("ssd", 4)
    with pytest.raises(ValueError, match="capacity must be a positive number of blocks, got 0"):
        llm.engine.kv_offload.attach("host", 0)


def test_engine_config_attaches_the_tier_and_refuses_what_cannot_hold_one():
    from minillm.config import EngineConfig
    llm = LLM("tiny", kv_offload="host", kv_offload_blocks=7)
    assert llm.engine.kv_offload.stats()["capacity_blocks"] == 7
    with pytest.raises(ValueError, match="kv_offload must be None or one of host, disk, got 'ssd'"):
        EngineConfig.from_knobs(kv_offload="ssd")
    with pytest.raises(ValueError, match="needs kv_cache='paged' and enable_prefix_caching=True"):
        EngineConfig.from_knobs(kv_offload="disk", enable_prefix_caching=False)
    with pytest.raises(ValueError, match="kv_offload_blocks must be a positive integer, got 0"):
        EngineConfig.from_knobs(kv_offload="host", kv_offload_blocks=0)


def test_an_allocation_refused_for_room_leaves_the_tier_untouched_and_a_later_one_restores():
    from minillm.cache.block_manager import BlockManager
    manager = BlockManager(8, BS, enable_prefix_caching=True)
    manager.tier = OffloadStore(small_pool(), "host", 8)
    prompt = list(range(1, 3 * BS + 2))  # three full blocks and one token
    table = manager.allocate(prompt)
    manager.register(table, prompt, len(prompt))
    manager.free(table)
    assert manager.offload(prompt) == 3
    other = manager.allocate([7] * (8 * BS))  # fills the pool
    order, misses = list(manager.tier.entries), manager.tier.stats()["misses"]
    for _ in range(3):  # a waiting request asks again every step
        assert manager.allocate(prompt) is None  # no room: its three blocks stay in the tier, nothing counted
    assert list(manager.tier.entries) == order and manager.tier.stats()["misses"] == misses
    manager.free(other)
    table = manager.allocate(prompt)
    assert table is not None and len(table.blocks) == 4
    assert manager.tier.stats()["restores"] == 3 and manager.tier.stats()["misses"] == misses
