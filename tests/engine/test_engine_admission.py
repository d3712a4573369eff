"""The scheduler owns admission: first_scheduled_time is written once, when a request is first admitted,
and a prefilled request (disaggregated serving) is admitted through the scheduler's own rules."""
import json

import pytest
import torch

from minillm import SamplingParams
from minillm.cache.paged import PagedCacheManager
from minillm.config import EngineConfig, SchedulerConfig
from minillm.disagg.kv_transfer import pack_kv, unpack_kv
from minillm.engine.engine import LLMEngine
from minillm.engine.scheduler import Scheduler
from minillm.models.model_config import ModelConfig
from minillm.models.registry import resolve_model_path
from minillm.sequence import Sequence, SequenceStatus

TINY = resolve_model_path("tiny")
BLOCK = 16
GREEDY = dict(temperature=0, ignore_eos=True)


def scheduler(num_blocks: int = 16, **config) -> Scheduler:
    """A Scheduler over a pool of num_blocks; config: SchedulerConfig fields."""
    cfg = ModelConfig.from_dict(json.loads((TINY / "config.json").read_text()))
    cache = PagedCacheManager(cfg, num_blocks, BLOCK, torch.float32, torch.device("cpu"), False)
    return Scheduler(SchedulerConfig(**config), cache)


def request(num_tokens: int, n: int = 1, rid: str = "r") -> Sequence:
    params = SamplingParams(max_tokens=8, n=n, **GREEDY)
    samples = [Sequence(rid, None, list(range(1, num_tokens + 1)), params, torch.Generator(), None, (), index=i)
               for i in range(n)]
    samples[0].forks = samples[1:]
    return samples[0]


def test_first_scheduled_time_is_the_first_admission_and_survives_preemption():
    sched, seq = scheduler(), request(20)
    sched.add(seq)
    sched.advance(sched.schedule(1.0))
    assert seq.metrics.first_scheduled_time == 1.0
    sched.preempt(seq)
    assert sched.schedule(5.0) and seq.status == SequenceStatus.RUNNING  # admitted again, to recompute
    assert seq.metrics.first_scheduled_time == 1.0


def test_the_other_samples_are_scheduled_when_their_request_was():
    """A chunked prompt admitted at t=1 finishes its prefill at t=3: its forks join then, first
    scheduled at t=1 like the sample they fork from."""
    sched, head = scheduler(max_num_batched_tokens=16), request(40, n=3)
    sched.add(head)
    for now in (1.0, 2.0, 3.0):
        assert len(sched.running) == (1 if now > 1.0 else 0)  # the forks wait for the whole prompt
        sched.advance(sched.schedule(now))
    assert len(sched.running) == 3
    assert [s.metrics.first_scheduled_time for s in sched.running] == [1.0, 1.0, 1.0]


def test_a_prefilled_request_is_admitted_with_its_own_clock_and_its_prompt_computed():
    sched, head = scheduler(), request(37, n=2)
    filled = []
    samples = sched.admit_prefilled(head, 0.25, lambda seq: filled.append(seq.num_computed_tokens))
    assert [s.index for s in samples] == [0, 1] and filled == [0]  # one fill, from the first uncomputed token
    assert all(s.status == SequenceStatus.RUNNING and s.num_computed_tokens == 37 for s in samples)
    assert [s.metrics.first_scheduled_time for s in samples] == [0.25, 0.25]
    assert not sched.waiting and sched.running == samples


@pytest.mark.parametrize("why", ["max_num_seqs", "waiting", "blocks"])
def test_a_prefilled_request_is_refused_by_the_schedulers_rules_with_nothing_changed(why):
    sched = scheduler(num_blocks=4, max_num_seqs=1 if why == "max_num_seqs" else 4)
    holder = request(40 if why == "blocks" else 5, rid="holder")  # 40 tokens: 3 of the 4 blocks
    sched.add(holder)
    if why != "waiting":
        sched.advance(sched.schedule(1.0))
    used, queued, running = sched.cache.stats(sched.running).used_blocks, list(sched.waiting), list(sched.running)
    head = request(20, rid="moved")  # 2 blocks
    assert sched.admit_prefilled(head, 0.5, lambda seq: pytest.fail("filled a refused request")) is None
    assert head.kv is None and head.status == SequenceStatus.WAITING and head.metrics.first_scheduled_time is None
    assert (sched.cache.stats(sched.running).used_blocks, list(sched.waiting), sched.running) == (used, queued, running)


@pytest.fixture(scope="module")
def prefilled():
    """A 37-token prompt prefilled by one engine and handed off; -> (the handoff, its params, the
    tokens the prompt gets on one engine)."""
    params = SamplingParams(max_tokens=6, **GREEDY)
    prompt = list(range(200, 237))
    engine = LLMEngine(EngineConfig.from_knobs("tiny", block_size=BLOCK, num_kv_blocks=32))
    engine.add_request(prompt, params, "colocated")
    want = []
    while engine.has_unfinished():
        want += [t for c in engine.step() for t in c.token_ids]
    engine.add_request(prompt, params, "moved")
    engine.step()
    return engine.handoff.give("moved", pack_kv), params, want


@pytest.mark.parametrize("why", ["max_num_seqs", "waiting", "blocks"])
def test_add_prefilled_waits_for_the_scheduler_then_decodes_as_one_engine_would(why, prefilled):
    handoff, params, want = prefilled
    engine = LLMEngine(EngineConfig.from_knobs("tiny", block_size=BLOCK, num_kv_blocks=4 if why == "blocks" else 32,
                                         max_num_seqs=1 if why == "max_num_seqs" else 4))
    engine.add_request(list(range(1, 41)), SamplingParams(max_tokens=4, **GREEDY), "holder")  # 3 blocks at most
    if why != "waiting":
        engine.step()
    before = (engine.view.num_waiting, engine.view.num_running, engine.view.kv_stats().used_blocks)
    assert engine.handoff.take(handoff, params, "moved", unpack_kv) is None
    assert (engine.view.num_waiting, engine.view.num_running, engine.view.kv_stats().used_blocks) == before
    chunks = None
    while chunks is None:  # offered again after each step, as the decode worker does
        engine.step()
        chunks = engine.handoff.take(handoff, params, "moved", unpack_kv)
    tokens = [t for c in chunks for t in c.token_ids]
    while engine.has_unfinished():
        tokens += [t for c in engine.step() if c.request_id == "moved" for t in c.token_ids]
    assert tokens == want


def test_samples_that_fork_after_prefill_never_run_past_max_num_seqs():
    """n = 4 requests under max_num_seqs = 8: each takes 4 seats at admission, so two run at a time,
    never the 32 sequences that joining forks used to make. Every request still finishes."""
    engine = LLMEngine(EngineConfig.from_knobs("tiny", block_size=BLOCK, max_num_seqs=8))
    most = []
    engine.subscribe(lambda event: most.append(max(event.running, len(event.scheduled))))
    for i in range(8):
        engine.add_request(list(range(1 + i, 20 + i)), SamplingParams(max_tokens=6, n=4, seed=i, temperature=1.0))
    finished = set()
    while engine.has_unfinished():
        for chunk in engine.step():
            if chunk.request is not None:
                finished.add(chunk.request_id)
    assert max(most) == 8 and len(finished) == 8


def test_a_request_with_more_samples_than_max_num_seqs_is_refused_by_name():
    engine = LLMEngine(EngineConfig.from_knobs("tiny", block_size=BLOCK, max_num_seqs=2))
    with pytest.raises(ValueError, match=r"n \(3\) exceeds max_num_seqs \(2\)"):
        engine.add_request("def f():", SamplingParams(max_tokens=4, n=3))
    assert not engine.has_unfinished()
