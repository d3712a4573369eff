"""Agent sessions: the loop breaker's rules at their boundaries, the seeded workload, and the
harness running sessions that compete for a small pool, with and without the offload tier."""
import inspect
import json
import math
import statistics
from functools import partial

import pytest

from minillm import LLM
from minillm.agents import LoopBreaker, agent_workload, run_sessions
from minillm.agents.sessions import MAX_CALLS

BS = 8


def test_breaker_stops_at_the_max_calls_th_call():
    breaker = LoopBreaker(max_calls=4, max_tokens=10**6, repeat_window=3, max_repeats=3)
    assert [breaker.check(f"step {word}", 10) for word in "abc"] == [None] * 3
    assert breaker.check("step d", 10).startswith("calls")


def test_breaker_stops_when_the_tokens_reach_the_cap():
    breaker = LoopBreaker(max_calls=100, max_tokens=100, repeat_window=3, max_repeats=3)
    assert breaker.check("a", 60) is None and breaker.check("b", 39) is None  # 99 tokens
    assert breaker.check("c", 1).startswith("tokens")                         # 100: the cap reached


def test_breaker_stops_on_the_max_repeats_th_normalised_copy_within_the_window():
    breaker = LoopBreaker(max_calls=100, max_tokens=10**6, repeat_window=4, max_repeats=3)
    outputs = ["call search(page=1)", "other", "CALL  search(page=2)\n"]  # two copies once normalised
    assert [breaker.check(o, 1) for o in outputs] == [None] * 3
    assert breaker.check("call search(page=3) ", 1).startswith("repeat")      # the third, 4 calls in


def test_breaker_forgets_repeats_that_left_the_window():
    breaker = LoopBreaker(max_calls=100, max_tokens=10**6, repeat_window=3, max_repeats=2)
    assert [breaker.check(o, 1) for o in ["loop", "a", "b", "loop", "c", "d"]] == [None] * 6
    assert breaker.check("d", 1).startswith("repeat")


def test_breaker_refuses_bad_limits_by_name():
    with pytest.raises(ValueError, match="max_calls must be an integer >= 1, got 0"):
        LoopBreaker(0, 10, 3, 2)
    with pytest.raises(ValueError, match=r"max_repeats \(4\) must be <= repeat_window \(3\)"):
        LoopBreaker(5, 10, 3, 4)


CORPUS = list(range(1, 2000))


def test_workload_is_seeded_and_its_call_counts_lie_in_1_to_50():
    a, b = agent_workload(CORPUS, 20, seed=3), agent_workload(CORPUS, 20, seed=3)
    assert a == b and a != agent_workload(CORPUS, 20, seed=4)
    big = agent_workload(CORPUS, 2000, seed=0, tool_tokens=4, median_calls=6.0)
    calls = [s.num_calls for s in big.sessions]
    assert min(calls) >= 1 and max(calls) == MAX_CALLS  # the tail reaches the clip
    assert statistics.median(calls) == 6  # a log-normal's median is exp(mu)
    # P(calls > 50) = 1 - Phi(ln(50.5 / 6) / 1): the clipped tail's share, within sampling noise
    tail = 0.5 * math.erfc(math.log(50.5 / 6) / math.sqrt(2))
    assert abs(sum(c == MAX_CALLS for c in calls) / len(calls) - tail) < 0.01
    session = big.sessions[0]
    assert len(session.pauses) == len(session.tool_results) == session.num_calls
    assert all(0.05 <= p <= 0.15 for s in big.sessions for p in s.pauses)  # [0.5, 1.5] x 0.1 s
    assert big.system == CORPUS[:64] and all(len(r) == 4 for r in session.tool_results)


@pytest.fixture(scope="module")
def workload():
    """Three sessions with no tool pause: each next call is queued as soon as the last one ends, so the
    sessions interleave the same way on every run. (With wall-clock pauses the interleaving follows the
    machine's speed, and one order leaves a pool block after a block restored from the tier unreachable
    until it is recomputed: a known limit of the tier's matching, see BlockManager._tier_hits.)"""
    corpus = LLM("tiny", num_kv_blocks=4).tokenizer.encode(inspect.getsource(json.decoder))
    return agent_workload(corpus, 3, seed=1, system_tokens=24, task_tokens=8, tool_tokens=8, tool_seconds=0.0)


THREE_CALLS = partial(LoopBreaker, max_calls=3, max_tokens=10**6, repeat_window=4, max_repeats=4)


@pytest.mark.timeout(120)
def test_with_a_tier_every_next_call_hits_its_whole_previous_prefix(workload):
    """Three sessions in a pool that holds about one and a half of them: without the tier their
    prefixes are evicted, with it every follow-up call gets all of its previous call back."""
    runs = {}
    for name in ("recompute", "offload"):
        llm = LLM("tiny", block_size=BS, num_kv_blocks=10)
        if name == "offload":
            llm.engine.kv_offload.attach("host", 64)
        runs[name] = run_sessions(llm, workload, max_tokens=4, breaker=THREE_CALLS, offload=name == "offload")
        assert llm.engine.view.kv_stats().used_blocks == 0  # nothing leaks
        if name == "offload":
            stats = llm.engine.kv_offload.stats()
            assert 0 < stats["blocks"] <= 64 and stats["restores"] > 0 and runs[name].blocks_offloaded > 0
    offload = runs["offload"].followups()
    assert offload and all(c.cached_tokens >= (c.previous_tokens - 1) // BS * BS for c in offload)
    recompute = runs["recompute"].followups()
    assert sum(c.cached_tokens for c in recompute) < sum(c.cached_tokens for c in offload)
    assert [c.output_ids for c in sorted(runs["offload"].calls, key=lambda c: (c.session_id, c.call))] == \
        [c.output_ids for c in sorted(runs["recompute"].calls, key=lambda c: (c.session_id, c.call))]


def test_harness_takes_a_learners_breaker_and_stops_each_session_at_it(workload):
    class StopAfterOne:
        def check(self, output: str, tokens: int) -> str | None:
            return "stop: one call is enough"

    run = run_sessions(LLM("tiny", num_kv_blocks=40), workload, max_tokens=2, breaker=StopAfterOne)
    assert len(run.calls) == 3 and set(run.stop_reasons.values()) == {"stop: one call is enough"}
    assert sorted(run.stop_reasons) == [s.session_id for s in workload.sessions]
