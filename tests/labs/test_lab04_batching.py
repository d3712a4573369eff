"""Grader of lab 04, batching and scheduling.

Oracles: minillm's own step policies (minillm/engine/policy.py), run on an identical copy of each
state through FakeSched, a stand-in for the engine's scheduler with a small KV pool (free blocks,
a block size, prefix-cache hits on admission), compared on the step, the queues, the preemptions and
the KV blocks each request holds after it; minillm's runner and paged cache for the flattened
batch; and for 4.E the real engine with the notebook's policy against the engine with its own, make_room's
precondition checked as it is called, so that a step policy that plans a sequence make_room preempted is
named, not make_room.
"""
import functools
import math
import random
from collections import deque
from dataclasses import dataclass, field, replace

import torch

from minillm.arith import cdiv
from minillm.cache.block_manager import BlockTable
from minillm.cache.paged import PagedCacheManager
from minillm.engine import policy
from minillm.engine.runner import ModelRunner
from minillm.labkit import exercise
from minillm.labkit.endtoend import check_against_reference
from minillm.labkit.fixtures import one_thread
from minillm.labkit.plug import LabPartError, lab_components
from minillm.models.model_config import ModelConfig
from minillm.sampling import SamplingParams
from minillm.sequence import Phase, Sequence, SequenceStatus
from minillm.step import ScheduledSeq

EXERCISES = {"4.1": "static_step", "4.2": "prefill_chunks", "4.3": "continuous_step", "4.4": "make_room",
             "4.5": "flatten_batch", "4.E": "your step policy in the real engine"}


# -- a scheduler state, and the stand-in scheduler a policy acts through -------------------------
@dataclass
class State:
    """A scheduler state as data, so that the notebook's policy and the engine's each get a copy."""
    block_size: int
    free: int                                                  # blocks of the pool no one holds
    running: list = field(default_factory=list)                # (id, prompt, output, computed), oldest first
    waiting: list = field(default_factory=list)                # (id, prompt, output), front first
    hits: dict = field(default_factory=dict)                   # id -> prompt tokens the prefix cache supplies

    def __str__(self) -> str:
        running = ", ".join(f"{i}: {c}/{p + g} computed" for i, p, g, c in self.running) or "none"
        waiting = ", ".join(f"{i}: {tokens(p + g)}" + (f" ({self.hits[i]} cached)" if i in self.hits else "")
                            for i, p, g in self.waiting) or "none"
        return (f"running [{running}], waiting [{waiting}], {self.free} free blocks of {self.block_size} slots")


def sequence(rid: int, prompt_len: int, generated: int, computed: int) -> Sequence:
    seq = Sequence(str(rid), None, [1] * prompt_len, SamplingParams(), None, None, ())
    seq.token_ids += [1] * generated
    seq.num_computed_tokens = computed
    return seq


def who(seq) -> str:
    return f"request {seq.request_id}"


def tokens(n) -> str:
    return f"{n!r} token" + ("" if n == 1 else "s")


class FakeSched:
    """The operations the engine's scheduler gives a step policy (engine/scheduler.py), on real
    Sequences, over a pool of free blocks. A running sequence holds blocks for all its tokens, less
    the slot of a token it has sampled but not computed yet; prefix-hit blocks cost no free block."""

    def __init__(self, state: State, max_num_seqs: int, make_room=policy.make_room) -> None:
        self.block_size, self.free, self.max_num_seqs = state.block_size, state.free, max_num_seqs
        self.hits, self._make_room = dict(state.hits), make_room
        self.own: dict[str, int] = {}     # request id -> blocks taken from the pool
        self.shared: dict[str, int] = {}  # request id -> blocks the prefix cache supplied
        self.running: list[Sequence] = []
        self.waiting: deque[Sequence] = deque()
        self.num_preemptions = 0
        for rid, p, g, c in state.running:
            seq = sequence(rid, p, g, c)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            decoding = g > 0 and c == p + g - 1
            self.own[seq.request_id] = cdiv(p + g - decoding, self.block_size)
        for rid, p, g in state.waiting:
            self.waiting.append(sequence(rid, p, g, 0))

    def blocks(self, seq: Sequence) -> int:
        return self.own.get(seq.request_id, 0) + self.shared.get(seq.request_id, 0)

    def is_running(self, seq) -> bool:
        return any(s is seq for s in self.running)

    def admit(self, seq: Sequence) -> bool:
        assert any(s is seq for s in self.waiting), f"{who(seq)} is admitted, but it is not waiting"
        assert len(self.running) < self.max_num_seqs, \
            f"{who(seq)} is admitted while {len(self.running)} sequences run, with max_num_seqs = {self.max_num_seqs}"
        hit = self.hits.get(int(seq.request_id), 0) // self.block_size
        needed = cdiv(len(seq), self.block_size) - hit
        if needed > self.free:
            return False
        self.waiting.remove(seq)
        self.running.append(seq)
        seq.status, seq.num_computed_tokens = SequenceStatus.RUNNING, hit * self.block_size
        self.free -= needed
        self.own[seq.request_id], self.shared[seq.request_id] = needed, hit
        return True

    def grow(self, seq: Sequence, num_tokens: int) -> bool:
        assert self.is_running(seq), f"{who(seq)} is grown, but it is not running (preempted, or never admitted)"
        needed = cdiv(seq.num_computed_tokens + num_tokens, self.block_size) - self.blocks(seq)
        if needed > self.free:
            return False
        if needed > 0:
            self.free -= needed
            self.own[seq.request_id] += needed
        return True

    def preempt(self, seq: Sequence) -> None:
        assert self.is_running(seq), f"{who(seq)} is preempted, but it is not running"
        self.finish(seq)
        seq.status, seq.num_computed_tokens = SequenceStatus.WAITING, 0
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def make_room(self, seq: Sequence, num_tokens: int) -> bool:
        return self._make_room(self, seq, num_tokens)

    def finish(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.free += self.own.pop(seq.request_id)
        self.shared.pop(seq.request_id, None)


def ids(queue) -> list[int]:
    return [int(s.request_id) for s in queue]


def work(plan) -> list[tuple[int, int]]:
    return sorted((int(s.request_id), n) for s, n in plan)


def assert_runnable(sched: FakeSched, plan, budget: int | None, what: str) -> None:
    """The checks the engine's scheduler makes on a plan before running it."""
    assert isinstance(plan, list), f"{what}: the step is a {type(plan).__name__}, not a list of (sequence, tokens)"
    seen = []
    for item in plan:
        assert isinstance(item, tuple) and len(item) == 2, \
            f"{what}: {item!r} in the step is not a (sequence, tokens) pair"
        seq, n = item
        assert not any(s is seq for s in seen), f"{what}: {who(seq)} is in the step twice"
        seen.append(seq)
        assert sched.is_running(seq), f"{what}: {who(seq)} is in the step but not running"
        assert isinstance(n, int) and 1 <= n <= seq.num_tokens_to_compute, \
            f"{what}: {who(seq)} is given {tokens(n)}; it has {seq.num_tokens_to_compute} to compute"
        end = seq.num_computed_tokens + n
        assert sched.blocks(seq) * sched.block_size >= end, \
            (f"{what}: {who(seq)} is given {tokens(n)} without KV room: it holds {sched.blocks(seq)} "
             f"blocks of {sched.block_size} slots, and its tokens would reach {end}")
    total = sum(n for _, n in plan)
    assert budget is None or total <= budget or len(plan) == 1, \
        f"{what}: the step computes {total} tokens, over the budget of {budget}"


def outcome(sched: FakeSched, result) -> dict:
    first = {"the step's (request, tokens)": work(result)} if isinstance(result, list) else {"the answer": result}
    return {**first, "running after it": ids(sched.running), "waiting after it": ids(sched.waiting),
            "preemptions": sched.num_preemptions,
            "KV blocks each running request holds after it": {int(q.request_id): sched.blocks(q)
                                                              for q in sched.running},
            "free KV blocks after it": sched.free}


def compare(state: State, max_num_seqs: int, mine, reference, budget: int | None, what: str) -> None:
    """The notebook's step and the engine's, each on its own copy of `state`: the same outcome."""
    expected_sched = FakeSched(state, max_num_seqs)
    expected = outcome(expected_sched, reference(expected_sched))
    sched = FakeSched(state, max_num_seqs)
    try:
        result = mine(sched)
    except AssertionError as e:  # FakeSched refused an operation: say on which state
        raise AssertionError(f"{what}: {e}") from None
    if "the answer" not in expected:
        assert_runnable(sched, result, budget, what)
    got = outcome(sched, result)
    for key, value in expected.items():
        assert got[key] == value, f"{what}: {key} {got[key]}; the engine's policy on the same state gives {value}"


def continuous(lab, state: State, budget: int, max_num_seqs: int, chunked: bool, what: str) -> None:
    compare(state, max_num_seqs, lambda s: lab.continuous_step(s, budget, max_num_seqs, chunked),
            lambda s: policy.continuous_step(s, budget, max_num_seqs, chunked), budget,
            f"{what} ({state}; budget {budget}, max_num_seqs {max_num_seqs}, {'' if chunked else 'un'}chunked)")


def static(lab, state: State, max_num_seqs: int, what: str) -> None:
    compare(state, max_num_seqs, lambda s: lab.static_step(s, max_num_seqs),
            lambda s: policy.static_step(s, max_num_seqs), None, f"{what} ({state}; max_num_seqs {max_num_seqs})")


def random_state(rng: random.Random, max_running: int = 6) -> State:
    """Decodes, prompts part way through their prefill, preempted requests recomputing, waiting
    prompts with and without prefix hits, and pools from empty to roomy."""
    bs = rng.choice([1, 2, 3, 4, 8, 16])
    state, rid = State(bs, 0), 0
    for _ in range(rng.randint(0, max_running)):
        p, g = rng.randint(1, 40), rng.choice([0, 1, 2, 5])
        c = p + g - 1 if g and rng.random() < 0.8 else rng.randint(0, p + g - 1)
        state.running.append((rid, p, g, c))
        rid += 1
    for _ in range(rng.randint(0, 5)):
        p, g = rng.randint(1, 40), rng.choice([0, 0, 0, 3])
        state.waiting.append((rid, p, g))
        if (p + g - 1) // bs and rng.random() < 0.3:
            state.hits[rid] = rng.randint(1, (p + g - 1) // bs) * bs
        rid += 1
    state.free = rng.choice([0, 1, 2, rng.randint(0, 120 // bs), 10_000])
    return state


def play(step, state: State, outputs: dict, max_num_seqs: int, budget: int | None, what: str):
    """Requests to completion (`outputs`: id -> output tokens it generates); -> each step's work, preemptions."""
    sched, steps = FakeSched(state, max_num_seqs), []
    while sched.running or sched.waiting:
        plan = step(sched)
        assert_runnable(sched, plan, budget, f"{what}, step {len(steps)}")
        steps.append(work(plan))
        assert len(steps) < 1000, f"{what}: the requests never finish (1000 steps)"
        for seq, n in plan:
            seq.num_computed_tokens += n
            if seq.num_computed_tokens == len(seq):
                seq.token_ids.append(1)
                if len(seq.output_token_ids) >= outputs[int(seq.request_id)]:
                    sched.finish(seq)
    return steps, sched.num_preemptions


def compare_play(mine, reference, state, outputs, max_num_seqs, budget, what) -> None:
    expected, expected_preemptions = play(reference, state, outputs, max_num_seqs, budget, what)
    got, preemptions = play(mine, state, outputs, max_num_seqs, budget, what)
    for i, (g, e) in enumerate(zip(got, expected)):
        assert g == e, f"{what}: step {i} computes (request, tokens) {g}; the engine's policy computes {e}"
    assert len(got) == len(expected), \
        f"{what}: the requests finish in {len(got)} steps; with the engine's policy in {len(expected)}"
    assert preemptions == expected_preemptions, \
        f"{what}: {preemptions} preemptions; the engine's policy makes {expected_preemptions}"


def workload(seed: int, n: int, bs: int, free: int) -> tuple[State, dict]:
    rng = random.Random(seed)
    state = State(bs, free, waiting=[(i, rng.randint(1, 30), 0) for i in range(n)])
    state.hits = {i: bs * rng.randint(1, (p - 1) // bs) for i, p, _ in state.waiting if (p - 1) // bs and i % 3 == 1}
    return state, {i: rng.randint(1, 12) for i in range(n)}


DECODES = [(0, 10, 1, 10), (1, 6, 1, 6), (2, 20, 2, 21)]  # (id, prompt, output, computed): three decoding


# -- 4.1 static batching ----------------------------------------------------------------------
@exercise("4.1")
def test_static_batch_admits_up_to_max_num_seqs_when_idle(lab):
    """with nothing running, the front max_num_seqs waiting sequences are admitted, each computing its prompt"""
    waiting = [(0, 9, 0), (1, 14, 0), (2, 5, 0), (3, 11, 0), (4, 6, 0)]
    for max_num_seqs in (1, 2, 4, 5, 7):
        static(lab, State(4, 100, waiting=waiting), max_num_seqs, "an idle static batcher")


@exercise("4.1")
def test_static_batch_admits_nobody_while_it_runs(lab):
    """while any member runs, each member computes what it has left and nobody joins, though slots are free"""
    static(lab, State(4, 100, running=[(0, 9, 3, 11)], waiting=[(1, 5, 0), (2, 6, 0)]), 4, "one member left decoding")
    static(lab, State(8, 100, running=DECODES, waiting=[(3, 2, 0)]), 8, "three members decoding")


@exercise("4.1")
def test_static_admission_stops_when_the_pool_is_full(lab):
    """admission stops at the first sequence the pool has no room for; nobody behind it jumps ahead"""
    static(lab, State(4, 6, waiting=[(0, 9, 0), (1, 13, 0), (2, 2, 0)]), 3, "3 blocks for 9 tokens, then 4 for 13")
    static(lab, State(4, 2, waiting=[(0, 9, 0), (1, 3, 0)]), 3, "a first prompt larger than the pool")
    static(lab, State(4, 6, waiting=[(0, 9, 0), (1, 12, 0), (2, 1, 0)]), 3, "two prompts filling the pool exactly")


@exercise("4.1")
def test_static_batch_computes_past_a_prefix_hit(lab):
    """an admitted prompt whose first blocks the prefix cache supplies computes only the rest"""
    state = State(8, 100, waiting=[(0, 30, 0), (1, 12, 0)], hits={0: 24, 1: 8})
    static(lab, state, 4, "prefix hits of 24 and 8 tokens")


@exercise("4.1")
def test_static_members_get_kv_room_and_the_newest_is_preempted(lab):
    """members that need a new block get it through make_room, preempting the newest when the pool is empty"""
    state = State(4, 0, running=[(0, 8, 1, 8), (1, 6, 1, 6), (2, 4, 1, 4)], waiting=[(3, 3, 0)])
    for free in (0, 1, 2):
        static(lab, replace(state, free=free), 4, f"two members starting a new block, {free} free blocks")


@exercise("4.1")
def test_static_steps_match_the_engine_on_random_states(lab):
    """300 random states (half with nothing running): the same steps as the engine's static policy"""
    rng = random.Random(41)
    for case in range(300):
        state = random_state(rng, max_running=0 if case % 2 else 6)
        static(lab, state, max(len(state.running), rng.randint(1, 8)), f"random state {case}")


@exercise("4.1")
def test_static_batches_play_out_like_the_engine(lab):
    """whole workloads, with prefix hits and a pool small enough to preempt, take the engine's static steps"""
    for seed, bs, free, max_num_seqs in ((1, 4, 60, 3), (2, 3, 16, 4), (3, 1, 45, 5)):
        state, outputs = workload(seed, 8, bs, free)
        compare_play(lambda s: lab.static_step(s, max_num_seqs), lambda s: policy.static_step(s, max_num_seqs),
                     state, outputs, max_num_seqs, None,
                     f"8 requests, {free} blocks of {bs}, max_num_seqs {max_num_seqs}")


# -- 4.2 chunked prefill ----------------------------------------------------------------------
def engine_chunks(prompt_len: int, budget: int, num_decodes: int) -> list[int]:
    """The chunks the engine's own continuous policy gives a prompt next to num_decodes decodes."""
    state = State(1, 10_000, running=[(i, 3, 1, 3) for i in range(num_decodes)],
                  waiting=[(num_decodes, prompt_len, 0)])
    sched, chunks = FakeSched(state, num_decodes + 1), []
    while sum(chunks) < prompt_len:
        for seq, n in policy.continuous_step(sched, budget, num_decodes + 1, True):
            seq.num_computed_tokens += n
            if int(seq.request_id) == num_decodes:
                chunks.append(n)
            if seq.num_computed_tokens == len(seq):
                seq.token_ids.append(1)
    return chunks


@exercise("4.2")
def test_prefill_chunks_fill_the_budget_left_by_decodes(lab):
    """every chunk but the last fills what the decodes leave of the budget, the last takes the rest, and they
    sum to the prompt"""
    for prompt_len, budget, decodes in ((100, 32, 6), (52, 16, 3), (5, 64, 0), (7, 3, 2), (41, 11, 1),
                                        (30, 10, 0), (1, 2, 1), (29, 30, 0), (31, 30, 0)):
        got = list(lab.prefill_chunks(prompt_len, budget, decodes))
        expected = engine_chunks(prompt_len, budget, decodes)
        assert got == expected, (f"prefill_chunks({prompt_len}, budget={budget}, num_decodes={decodes}) = {got}; "
                                 f"the engine computes the prompt in chunks {expected}")


@exercise("4.2")
def test_prefill_chunks_match_the_engine_on_random_cases(lab):
    """200 random prompts, budgets and decode counts: the chunks the engine's continuous policy computes"""
    rng = random.Random(42)
    for _ in range(200):
        decodes = rng.randint(0, 12)
        budget = decodes + rng.randint(1, 40)
        prompt_len = rng.choice([rng.randint(1, 200), (budget - decodes) * rng.randint(1, 6)])
        got = list(lab.prefill_chunks(prompt_len, budget, decodes))
        expected = engine_chunks(prompt_len, budget, decodes)
        assert got == expected, (f"prefill_chunks({prompt_len}, budget={budget}, num_decodes={decodes}) = {got}; "
                                 f"the engine computes the prompt in chunks {expected}")


@exercise("4.2")
def test_prefill_chunks_refuse_a_budget_with_no_room(lab):
    """a budget the decodes use up entirely (or more than), and a budget of 0 or below, raise ValueError"""
    for budget, decodes in ((8, 8), (4, 9), (1, 1), (0, 0), (-3, 0)):
        try:
            lab.prefill_chunks(30, budget, decodes)
        except ValueError:
            continue
        raise AssertionError(f"prefill_chunks(30, budget={budget}, num_decodes={decodes}) did not raise ValueError")


# -- 4.3 continuous batching ------------------------------------------------------------------
@exercise("4.3")
def test_running_sequences_are_served_before_waiting_ones(lab):
    """running decodes are scheduled first; a waiting prompt gets what is left of the budget"""
    continuous(lab, State(4, 100, DECODES, [(3, 40, 0)]), 16, 8, True, "3 decodes and a waiting prompt")
    continuous(lab, State(4, 100, DECODES, [(3, 40, 0)]), 3, 8, True, "3 decodes using the whole budget")
    continuous(lab, State(4, 100, DECODES, [(3, 2, 0)]), 4, 8, False, "3 decodes and a 2-token prompt")


@exercise("4.3")
def test_a_step_may_use_exactly_its_budget_and_no_more(lab):
    """a prompt that fits what is left exactly is admitted; one token more, and admission stops"""
    for prompt_len in (12, 13, 14):
        for chunked in (False, True):
            continuous(lab, State(4, 100, DECODES, [(3, prompt_len, 0), (4, 1, 0)]), 16, 8, chunked,
                       f"3 decodes and a {prompt_len}-token prompt")


@exercise("4.3")
def test_a_sequence_gets_no_tokens_when_no_budget_is_left(lab):
    """chunked, once the budget is spent a running prefill gets nothing and nobody is admitted"""
    running = DECODES + [(3, 30, 0, 8)]
    continuous(lab, State(4, 100, running, [(4, 5, 0)]), 3, 8, True, "decodes using the budget, then a prefill")
    continuous(lab, State(4, 100, running, [(4, 5, 0)]), 4, 8, True, "one token left for a prefill")


@exercise("4.3")
def test_an_unchunked_prompt_over_the_budget_runs_only_alone(lab):
    """unchunked, a sequence over the budget runs alone in an empty step, and otherwise waits"""
    continuous(lab, State(4, 100, waiting=[(0, 50, 0), (1, 4, 0)]), 16, 8, False,
               "a 50-token prompt first in the queue")
    continuous(lab, State(4, 100, [(0, 50, 0, 0), (1, 6, 1, 6)], [(2, 3, 0)]), 16, 8, False,
               "an unstarted 50-token prompt running ahead of a decode")
    continuous(lab, State(4, 100, [(1, 6, 1, 6), (0, 50, 0, 0), (2, 7, 1, 7)], [(3, 3, 0)]), 16, 8, False,
               "a 50-token prompt running between two decodes")


@exercise("4.3")
def test_an_idle_running_sequence_keeps_its_seat_in_a_full_batch(lab):
    """a running sequence that gets no tokens keeps its blocks and its seat: with the batch full, a waiting
    prompt that fits the budget left stays waiting; with a seat free, it joins"""
    running = [(0, 6, 1, 6), (1, 50, 0, 0), (2, 7, 1, 7)]  # a decode, a prompt over the budget, a decode
    for max_num_seqs in (3, 4):
        continuous(lab, State(4, 100, running, [(3, 3, 0), (4, 2, 0)]), 16, max_num_seqs, False,
                   f"{max_num_seqs - 3} seat(s) free, a running prompt idle with budget left")
    running = [(0, 6, 1, 6), (1, 50, 0, 20), (2, 7, 1, 7)]  # the idle prompt part way through its prefill
    continuous(lab, State(4, 100, running, [(3, 3, 0)]), 16, 3, False, "the batch full, a half-done prompt idle")


@exercise("4.3")
def test_max_num_seqs_caps_admission(lab):
    """no more than max_num_seqs sequences run after the step, however much budget is left"""
    waiting = [(3, 4, 0), (4, 4, 0), (5, 2, 0)]
    for max_num_seqs in (3, 4, 5):
        continuous(lab, State(4, 100, DECODES, waiting), 100, max_num_seqs, True, "3 running")


@exercise("4.3")
def test_admission_stops_when_the_pool_has_no_room(lab):
    """a waiting prompt the pool has no room for stops admission; smaller ones behind it wait too"""
    continuous(lab, State(4, 2, DECODES, [(3, 13, 0), (4, 3, 0)]), 64, 8, True, "a 13-token prompt, 2 free blocks")
    continuous(lab, State(4, 4, DECODES, [(3, 13, 0), (4, 3, 0)]), 64, 8, False, "a 13-token prompt, 4 free blocks")
    for chunked in (True, False):
        continuous(lab, State(4, 4, DECODES, [(3, 16, 0), (4, 1, 0)]), 64, 8, chunked,
                   "a 16-token prompt taking the 4 free blocks exactly")


@exercise("4.3")
def test_a_prefix_hit_leaves_fewer_tokens_to_compute(lab):
    """after admission, a prompt whose first blocks are cached computes only the rest, leaving budget for others"""
    state = State(8, 100, DECODES[:2], [(3, 30, 0), (4, 20, 0)], hits={3: 24})
    continuous(lab, state, 10, 8, True, "a 30-token prompt with 24 cached")
    continuous(lab, state, 60, 8, False, "a 30-token prompt with 24 cached")
    continuous(lab, State(4, 100, waiting=[(0, 9, 0), (1, 17, 0)], hits={0: 8, 1: 16}), 5, 8, True,
               "two prompts with all but their last token cached")


@exercise("4.3")
def test_running_sequences_get_kv_room_preempting_the_newest(lab):
    """a running sequence that needs a new block gets it through make_room; the newest gives its blocks up"""
    state = State(4, 0, [(0, 8, 1, 8), (1, 6, 1, 6), (2, 4, 1, 4)], [(3, 3, 0)])
    for free in (0, 1, 2):
        continuous(lab, replace(state, free=free), 16, 8, True, f"two decodes starting a new block, {free} free blocks")
        continuous(lab, State(2, free, [(0, 5, 0, 4), (1, 3, 1, 3), (2, 4, 1, 4)]), 16, 8, False,
                   f"a prefill and a decode starting a new block, {free} free blocks")


@exercise("4.3")
def test_continuous_steps_match_the_engine_on_random_states(lab):
    """400 random states (decodes, half-done prefills, preempted requests, prefix hits, odd budgets, small
    pools): the same step as the engine's continuous policy"""
    rng = random.Random(43)
    for case in range(400):
        state = random_state(rng)
        budget, chunked = rng.randint(1, 60), rng.random() < 0.6
        continuous(lab, state, budget, max(len(state.running), rng.randint(1, 8)), chunked, f"random state {case}")


@exercise("4.3")
def test_continuous_workloads_play_out_like_the_engine(lab):
    """whole workloads, chunked and not, with prefix hits and pools small enough to preempt, take the engine's steps"""
    for seed, bs, free, max_num_seqs, budget, chunked in ((1, 4, 200, 3, 12, True), (2, 4, 200, 4, 30, False),
                                                           (3, 3, 14, 5, 16, True), (4, 2, 22, 6, 24, False),
                                                           (5, 1, 45, 8, 9, True)):
        state, outputs = workload(seed, 10, bs, free)
        compare_play(lambda s: lab.continuous_step(s, budget, max_num_seqs, chunked),
                     lambda s: policy.continuous_step(s, budget, max_num_seqs, chunked), state, outputs,
                     max_num_seqs, budget, f"10 requests, {free} blocks of {bs}, budget {budget}, "
                     f"max_num_seqs {max_num_seqs}, {'' if chunked else 'un'}chunked")


# -- 4.4 preemption ---------------------------------------------------------------------------
def room(lab, state: State, needy: int, num_tokens: int, what: str) -> None:
    def call(fn):
        return lambda s: fn(s, next(q for q in s.running if int(q.request_id) == needy), num_tokens)
    compare(state, 8, call(lab.make_room), call(policy.make_room), None,
            f"{what}: make_room(request {needy}, {num_tokens}) ({state})")


FOUR = [(0, 40, 0, 40), (1, 17, 0, 17), (2, 9, 0, 9), (3, 33, 0, 33)]  # blocks of 8: 5, 3, 2, 5


@exercise("4.4")
def test_make_room_preempts_the_newest_until_it_fits(lab):
    """victims are taken from the newest end, just enough of them; they go to the queue's front, oldest first"""
    for num_tokens, free in ((6, 0), (8, 1), (30, 1), (48, 0), (55, 1), (72, 0), (80, 0), (88, 0)):
        room(lab, State(8, free, FOUR, [(9, 5, 0)]), 0, num_tokens, f"{free} free blocks")


@exercise("4.4")
def test_make_room_preempts_nobody_when_there_is_room(lab):
    """with room for the tokens, nobody is preempted and the answer is True"""
    for num_tokens, free in ((1, 0), (7, 0), (8, 1), (40, 5)):
        room(lab, State(8, free, FOUR), 3, num_tokens, f"{free} free blocks")


@exercise("4.4")
def test_make_room_stops_after_preempting_the_needy_sequence(lab):
    """when the needy sequence is the newest left, it is preempted itself, nothing older is, and the answer is False"""
    room(lab, State(8, 0, FOUR, [(9, 5, 0)]), 2, 80, "request 2 needing 10 blocks")
    room(lab, State(8, 0, FOUR), 3, 41, "the newest needing a sixth block")
    room(lab, State(4, 0, [(0, 3, 1, 3)]), 0, 5, "the only running sequence needing a block")


@exercise("4.4")
def test_make_room_at_the_exact_boundaries(lab):
    """victims whose blocks (with the free ones) exactly cover the need are all that go, one token more takes the
    next one; a need that fits the needy sequence's partly filled last block preempts nobody"""
    for needy, num_tokens, free in ((0, 40, 0), (0, 41, 0), (0, 48, 1), (0, 49, 1), (1, 7, 0), (1, 8, 0),
                                    (2, 47, 0), (2, 48, 0), (0, 96, 2), (0, 97, 2)):
        room(lab, State(8, free, FOUR, [(9, 5, 0)]), needy, num_tokens, f"{free} free blocks")
    rng = random.Random(440)
    for case in range(150):
        state = random_state(rng)
        if not state.running:
            state.running.append((99, rng.randint(1, 30), 0, 0))
        state.free = rng.randint(0, 3)
        at = rng.randrange(len(state.running))
        sched = FakeSched(state, 8)
        seq, newer = sched.running[at], sched.running[at + 1:]
        victims = rng.randint(0, len(newer))
        room_for = state.free + sum(sched.blocks(v) for v in newer[len(newer) - victims:])
        fits = (sched.blocks(seq) + room_for) * state.block_size - seq.num_computed_tokens  # the most that fit
        for num_tokens in (fits, fits + 1):
            if num_tokens > 0:
                room(lab, state, state.running[at][0], num_tokens,
                     f"random state {case}, room for exactly {fits} tokens after {victims} preemptions")


@exercise("4.4")
def test_make_room_matches_the_engine_on_random_states(lab):
    """300 random states, block sizes 1 to 16, any running sequence in need: the engine's victims and answer"""
    rng = random.Random(44)
    for case in range(300):
        state = random_state(rng)
        if not state.running:
            state.running.append((99, rng.randint(1, 30), 0, 0))
        state.free = rng.randint(0, 4)
        needy = rng.choice(state.running)[0]
        room(lab, state, needy, rng.randint(1, 4 * state.block_size), f"random state {case}")


# -- 4.5 flattening a step --------------------------------------------------------------------
def flat_reference(token_ids, computed, num_tokens, tables, block_size):
    """minillm's runner and paged cache on the same step: -> input_ids, positions, cu_seqlens, slot_mapping."""
    seqs = []
    for i, (ids_, c, table) in enumerate(zip(token_ids, computed, tables)):
        seq = sequence(i, len(ids_), 0, c)
        seq.token_ids, seq.kv = list(ids_), BlockTable(list(table))
        seqs.append(seq)
    batch = [ScheduledSeq(s, n, Phase.PREFILL, False) for s, n in zip(seqs, num_tokens)]
    input_ids, positions, _ = ModelRunner(None, None, torch.device("cpu")).prepare(batch)
    cfg = ModelConfig("LlamaForCausalLM", 64, 8, 8, 1, 1, 1, 4, 256)
    num_blocks = 1 + max(max(t) for t in tables)
    cache = PagedCacheManager(cfg, num_blocks, block_size, torch.float32, torch.device("cpu"), False)
    slots = cache.context(batch).slot_mapping
    cu = torch.tensor([0] + list(num_tokens)).cumsum(0)
    return input_ids, positions, cu, slots


def assert_flattened_like_minillm(lab, step, what: str) -> None:
    got = lab.flatten_batch(*step)
    assert isinstance(got, tuple) and len(got) == 4, "flatten_batch returns a tuple of 4 tensors"
    for name, g, e in zip(("input_ids", "positions", "cu_seqlens", "slot_mapping"), got, flat_reference(*step)):
        assert isinstance(g, torch.Tensor), f"{what}: {name} is a {type(g).__name__}, not a tensor"
        assert g.dtype == torch.int64, f"{what}: {name} is {g.dtype}, not int64"
        assert g.tolist() == e.tolist(), (f"{what} (block size {step[4]}, computed {step[1]}, tokens {step[2]}): "
                                          f"{name} {g.tolist()}; minillm's runner and paged cache give {e.tolist()}")


def random_step(seed: int):
    rng = random.Random(seed)
    bs = rng.choice([1, 3, 4, 16])
    token_ids, computed, num_tokens, tables = [], [], [], []
    for _ in range(rng.randint(2, 5)):
        length = rng.randint(2, 40)
        c = rng.choice([0, length - 1, rng.randint(0, length - 1)])  # prefill, decode, or a later chunk
        n = length - c if c else rng.randint(1, length)
        token_ids.append([rng.randrange(1000) for _ in range(length)])
        computed.append(c)
        num_tokens.append(n)
        tables.append(rng.sample(range(60), math.ceil(length / bs)))
    return token_ids, computed, num_tokens, tables, bs


@exercise("4.5")
def test_flatten_batch_matches_minillm_on_mixed_steps(lab):
    ("prefills, later chunks and decodes of several sequences: ids, positions, cu_seqlens, "
     "slots as minillm builds them")
    for seed in range(451, 491):
        assert_flattened_like_minillm(lab, random_step(seed), f"random step {seed - 450}")


@exercise("4.5")
def test_flatten_batch_offsets_positions_of_chunks_and_decodes(lab):
    """a chunk starting at token 5 and a decode at token 11 get their absolute positions and slots"""
    ids_, positions, cu, slots = lab.flatten_batch([list(range(100, 112)), list(range(200, 212))], [5, 11], [4, 1],
                                                   [[6, 2, 7], [1, 5, 0]], 4)
    assert ids_.tolist() == [105, 106, 107, 108, 211], f"input_ids {ids_.tolist()}, expected [105, 106, 107, 108, 211]"
    assert positions.tolist() == [5, 6, 7, 8, 11], f"positions {positions.tolist()}, expected [5, 6, 7, 8, 11]"
    assert cu.tolist() == [0, 4, 5], f"cu_seqlens {cu.tolist()}, expected [0, 4, 5]"
    assert slots.tolist() == [9, 10, 11, 28, 3], f"slot_mapping {slots.tolist()}, expected [9, 10, 11, 28, 3]"


@exercise("4.5")
def test_flatten_batch_fills_the_last_partial_block(lab):
    """block sizes 1, 3 and 16: steps ending in a partly filled last block, and chunks crossing a block boundary"""
    for bs in (1, 3, 16):
        lengths, computed = [7, 20, 34], [0, 2 * bs - 1 if 2 * bs < 20 else 17, 33]
        num_tokens = [7, 20 - computed[1], 1]
        tables = [[(5 * i + 3 * b) % 97 for b in range(cdiv(n, bs))] for i, n in enumerate(lengths)]
        token_ids = [[1000 * i + t for t in range(n)] for i, n in enumerate(lengths)]
        assert_flattened_like_minillm(lab, (token_ids, computed, num_tokens, tables, bs),
                                      f"prefill, chunk and decode with block size {bs}")


# -- 4.E the whole policy in the real engine --------------------------------------------------
def _running(sched, seq) -> bool:
    return any(s is seq for s in sched.running)


class _MakeRoomView:
    """The engine's scheduler as the notebook's make_room sees it: the same queues and operations, with
    grow and preempt refusing a sequence that is not running, in make_room's name (the engine's own grow
    would fail deep in the KV cache, with an AttributeError)."""

    def __init__(self, sched, label: str) -> None:
        self._sched, self._label = sched, label

    def __getattr__(self, name):
        return getattr(self._sched, name)

    def grow(self, seq, num_tokens):
        if not _running(self._sched, seq):
            raise LabPartError(f"{self._label}: make_room asked grow for KV room for request {seq.request_id}, which "
                               f"is not running: make_room had preempted it already (a preempted sequence holds no "
                               f"blocks and computes nothing this step)")
        return self._sched.grow(seq, num_tokens)

    def preempt(self, seq):
        if not _running(self._sched, seq):
            raise LabPartError(f"{self._label}: make_room preempted request {seq.request_id}, which is not running")
        return self._sched.preempt(seq)


def watched(components):
    """The notebook's parts for the engine, with make_room's precondition checked as it is called: a step
    policy that asks make_room for room for a sequence that is not running is the exercise at fault
    (4.1 or 4.3), not make_room (4.4). Each wrapper keeps the part's call counter and label."""
    deciding = [None]  # the label of the step policy planning the current step

    def policy_step(part):
        @functools.wraps(part)
        def step(*args, **kwargs):
            deciding[0] = part.label
            return part(*args, **kwargs)
        return step

    room = components.make_room

    @functools.wraps(room)
    def make_room(sched, seq, num_tokens):
        if not _running(sched, seq):
            preempted = seq.request_id in getattr(sched, "preempted_now", [])
            raise LabPartError(
                f"{deciding[0]} planned request {seq.request_id}, which is not running: it asked make_room for KV "
                f"room for it after " + ("make_room had preempted it earlier in this step (for itself or for an older "
                                         "sequence); a preempted sequence computes nothing this step"
                                         if preempted else "it left the running sequences"))
        return room(_MakeRoomView(sched, room.label), seq, num_tokens)

    return replace(components, make_room=make_room, static_step=policy_step(components.static_step),
                   continuous_step=policy_step(components.continuous_step))


@exercise("4.E", timeout=120)
def test_your_step_policy_runs_the_real_engine(lab):
    ("the real engine with your step policy gives the reference engine's tokens, continuous and static, "
     "leaking no block")
    with one_thread():  # pico's small steps: more threads only wait on a busy machine
        check_against_reference(watched(lab_components(lab, labs=["04"])))
