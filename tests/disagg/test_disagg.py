"""Prefill/decode disaggregation (minillm/disagg/disaggregated_llm.py): two worker processes, KV moved over gloo.

References: the colocated LLM.generate (the same tokens), Hugging Face transformers' own KV cache
(the K/V that arrive), the model's config.json (the bytes formula), the slot formula of the pool.
"""
import json
import os
import signal

import pytest
import torch

from minillm import LLM, SamplingParams
from minillm.cache.pool import PagedKVPool
from minillm.disagg.disaggregated_llm import DisaggregatedLLM
from minillm.disagg.handoff import digest
from minillm.disagg.kv_transfer import pack_kv, unpack_kv
from minillm.models.model_config import ModelConfig
from minillm.models.registry import resolve_model_path

pytestmark = pytest.mark.timeout(240)
BLOCK = 16
CONFIG = dict(num_kv_blocks=96, block_size=BLOCK)
TINY = resolve_model_path("tiny")
# prompt lengths: a partial block, exactly two blocks, one token past a block, a short text
PROMPTS = [list(range(100, 121)), list(range(300, 332)), list(range(7, 24)), "def fib(n):"]


@pytest.fixture(scope="module")
def disagg():
    llm = DisaggregatedLLM("tiny", check_kv=True, timeout=60, **CONFIG)
    yield llm
    llm.shutdown()


@pytest.fixture(scope="module")
def colocated():
    return LLM("tiny", **CONFIG)


@pytest.mark.subprocess
def test_greedy_outputs_equal_colocated_for_a_batch(disagg, colocated):
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    got, want = disagg.generate(PROMPTS, params), colocated.generate(PROMPTS, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert [o.text for o in got] == [o.text for o in want]
    assert got[3].prompt == "def fib(n):" and got[0].prompt_token_ids == PROMPTS[0]


@pytest.mark.subprocess
def test_seeded_samples_n_gt_1_equal_colocated(disagg, colocated):
    """Each sample's generator continues on the decode worker from the state the prefill left it in."""
    params = SamplingParams(max_tokens=6, temperature=1.0, seed=11, n=3, ignore_eos=True)
    got, want = disagg.generate(PROMPTS[:2], params), colocated.generate(PROMPTS[:2], params)
    assert [[c.token_ids for c in o.outputs] for o in got] == [[c.token_ids for c in o.outputs] for o in want]
    assert len({tuple(c.token_ids) for c in got[0].outputs}) > 1  # the samples differ: the test can fail


@pytest.mark.subprocess
def test_kv_arrives_bit_identical_and_equals_transformers_cache(disagg):
    transformers = pytest.importorskip("transformers")
    out = disagg.generate([PROMPTS[0]], SamplingParams(max_tokens=2, temperature=0))[0]
    record = disagg.transfers[out.request_id]
    assert record["received_sha256"] == record["sent_sha256"]  # what the prefill pool held, to the last bit
    assert digest(record["kv"]) == record["sent_sha256"]
    hf = transformers.AutoModelForCausalLM.from_pretrained(TINY, dtype=torch.float32)
    with torch.no_grad():
        cache = hf(torch.tensor([PROMPTS[0]]), use_cache=True).past_key_values
    kv = record["kv"]  # [2, layers, P, kv_heads, head_dim]
    for layer in range(kv.shape[1]):
        keys, values = cache.layers[layer].keys[0], cache.layers[layer].values[0]  # [kv_heads, P, head_dim]
        torch.testing.assert_close(kv[0, layer], keys.transpose(0, 1), atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(kv[1, layer], values.transpose(0, 1), atol=1e-4, rtol=1e-4)


@pytest.mark.subprocess
def test_bytes_moved_per_request_equal_the_formula(disagg):
    raw = json.loads((TINY / "config.json").read_text())
    outs = disagg.generate(PROMPTS, SamplingParams(max_tokens=3, temperature=0))
    for out in outs:
        p = len(out.prompt_token_ids)
        record = disagg.transfers[out.request_id]
        assert record["kv_bytes"] == p * raw["num_hidden_layers"] * 2 * raw["num_key_value_heads"] * raw["head_dim"] * 4
        assert record["wire_bytes"] > record["kv_bytes"]  # plus the header, tokens and generator states
        assert record["kv"].shape[2] == p


@pytest.mark.subprocess
def test_stream_yields_the_text_generate_returns(disagg):
    params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
    chunks = list(disagg.stream("import os\n", params))
    assert chunks[-1].finished and chunks[-1].request is not None
    assert "".join(c.text for c in chunks) == disagg.generate("import os\n", params)[0].text
    assert sum(len(c.token_ids) for c in chunks) == 10


@pytest.mark.subprocess
def test_logprobs_are_refused_with_the_reason(disagg):
    with pytest.raises(ValueError, match="logprobs"):
        disagg.generate("x = 1", SamplingParams(max_tokens=2, logprobs=2))


def test_pack_and_unpack_follow_the_slot_formula():
    cfg = ModelConfig.from_dict(json.loads((TINY / "config.json").read_text()))
    src, dst = (PagedKVPool(cfg, 8, 4, torch.float32, torch.device("cpu")) for _ in range(2))
    torch.manual_seed(0)
    src.k.normal_(), src.v.normal_()
    blocks, num_tokens = [5, 2, 7], 10  # the last block holds 2 of its 4 slots
    buffer = pack_kv(src, blocks, num_tokens)
    assert buffer.shape == (2, cfg.num_hidden_layers, num_tokens, cfg.num_key_value_heads, cfg.head_dim)
    for t in range(num_tokens):
        slot = blocks[t // 4] * 4 + t % 4
        assert torch.equal(buffer[0, :, t], src.k[:, slot]) and torch.equal(buffer[1, :, t], src.v[:, slot])
    dst.k.fill_(7.0)
    unpack_kv(buffer, dst, [1, 6, 0])
    assert torch.equal(pack_kv(dst, [1, 6, 0], num_tokens), buffer)
    assert torch.equal(dst.k[:, 0 * 4 + 2:0 * 4 + 4], torch.zeros_like(dst.k[:, :2]))  # the tail: zeros
    assert torch.equal(dst.k[:, 3 * 4:4 * 4], torch.full_like(dst.k[:, :4], 7.0))  # other blocks untouched
    with pytest.raises(ValueError, match="10 tokens fill 3 blocks"):
        unpack_kv(buffer, dst, [1, 6])


@pytest.mark.subprocess
def test_a_killed_worker_raises_a_clear_error_and_leaves_no_process():
    llm = DisaggregatedLLM("tiny", timeout=600, **CONFIG)  # past the test's guard: the death is seen, not timed out
    pids = llm.pids
    stream = llm.stream("def main():", SamplingParams(max_tokens=200, temperature=0, ignore_eos=True))
    next(stream)
    os.kill(pids["decode"], signal.SIGKILL)
    # The error names the signal: the driver saw the death itself, it did not wait out its timeout.
    with pytest.raises(RuntimeError, match=f"decode worker \\(pid {pids['decode']}\\) was killed by signal 9"):
        for _ in stream:
            pass
    for pid in pids.values():
        assert not os.path.exists(f"/proc/{pid}")  # reaped: no orphan, no zombie
    with pytest.raises(RuntimeError, match="stopped"):
        llm.generate("x", SamplingParams(max_tokens=1))


def test_the_decode_workers_handoff_record_brings_in_the_prefill_workers_first():
    """The facade reads two pipes. A short request can finish (its last chunk on the decode worker's pipe) before the
    facade has read the prefill worker's record of its handoff: CI once saw a record without its sent digest. The
    prefill worker writes that record before the K/V leave it, so the decode worker's report of their arrival makes
    the facade read the prefill pipe first. Here on real pipes, without workers: the decode side's messages alone."""
    import multiprocessing as mp

    from minillm.disagg.handoff import DECODE_RANK, PREFILL_RANK
    from minillm.disagg.worker_processes import send
    llm = DisaggregatedLLM.__new__(DisaggregatedLLM)  # no workers: only the pipes and what _handle reads
    ends = {rank: mp.Pipe() for rank in (PREFILL_RANK, DECODE_RANK)}
    llm._conns, llm.transfers, llm._live, llm.error = {r: a for r, (a, _) in ends.items()}, {}, {"7"}, None
    send(ends[PREFILL_RANK][1], ("handoff", 7, {"sent_sha256": "abc"}))
    send(ends[DECODE_RANK][1], ("handoff", 7, {"received_sha256": "abc", "kv_bytes": 10}))
    llm._drain(DECODE_RANK)
    assert llm.transfers["7"] == {"sent_sha256": "abc", "received_sha256": "abc", "kv_bytes": 10}
    assert not llm._conns[PREFILL_RANK].poll()
