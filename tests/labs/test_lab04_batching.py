"""Grader of lab 04, batching and scheduling. Oracles: minillm's Scheduler (driven with a cache
that always has room), its runner's flattening and its paged cache's slot mapping."""
import math
import random
from collections import deque

import torch

from minillm.cache.block_manager import BlockTable
from minillm.cache.paged import PagedCacheManager
from minillm.config import EngineConfig
from minillm.engine.runner import ModelRunner
from minillm.engine.scheduler import Scheduler
from minillm.state import FinishReason, Phase, ScheduledSeq, Sequence, SequenceStatus
from minillm.labkit import exercise
from minillm.models.config import ModelConfig
from minillm.sampling import SamplingParams

EXERCISES = {"4.1": "static_step", "4.2": "prefill_chunks", "4.3": "continuous_step", "4.4": "preempt_for",
             "4.5": "flatten_batch"}


def requests(lab, specs: list[tuple[int, int, int, int]]) -> list:
    """The notebook's Requests from (prompt_len, output_len, computed, generated)."""
    return [lab.Request(i, p, o, computed=c, generated=g) for i, (p, o, c, g) in enumerate(specs)]


def plan(batch) -> list[tuple[int, int]]:
    assert isinstance(batch, list), f"returns {type(batch).__name__}, not a list of (request, tokens)"
    return [(r.rid, int(n)) for r, n in batch]


def rids(queue) -> list[int]:
    return [r.rid for r in queue]


@exercise("4.1")
def test_static_batch_admits_up_to_max_num_seqs_when_idle(lab):
    """with nothing running, the first max_num_seqs waiting requests are admitted, each with its whole prompt"""
    reqs = requests(lab, [(7, 3, 0, 0), (12, 5, 0, 0), (3, 2, 0, 0), (9, 1, 0, 0), (4, 4, 0, 0)])
    running, waiting = [], deque(reqs)
    got = plan(lab.static_step(running, waiting, 3))
    assert got == [(0, 7), (1, 12), (2, 3)], f"step of an idle static batcher: {got}, expected [(0, 7), (1, 12), (2, 3)]"
    assert rids(running) == [0, 1, 2] and rids(waiting) == [3, 4], \
        f"running {rids(running)}, waiting {rids(waiting)} after admitting 3 of 5"


@exercise("4.1")
def test_static_batch_admits_nobody_until_it_drains(lab):
    """while any member runs, members decode and nobody joins, though slots are free"""
    reqs = requests(lab, [(7, 9, 7, 1), (5, 2, 0, 0), (6, 2, 0, 0)])
    running, waiting = [reqs[0]], deque(reqs[1:])
    got = plan(lab.static_step(running, waiting, 4))
    assert got == [(0, 1)], f"step with one member left decoding and 3 free slots: {got}, expected [(0, 1)]"
    assert rids(running) == [0] and rids(waiting) == [1, 2], \
        f"running {rids(running)}, waiting {rids(waiting)}: a static batch admitted while running"


@exercise("4.1")
def test_static_batches_play_out_like_minillm(lab):
    """a whole workload of static batches takes the steps minillm's static scheduler takes"""
    specs = [(5, 3), (9, 6), (4, 1), (11, 2), (3, 5), (8, 4), (6, 2)]
    got = play(lambda run, wait: lab.static_step(run, wait, 3), [lab.Request(i, p, o) for i, (p, o) in enumerate(specs)])
    expected = play_minillm(specs, EngineConfig(scheduler="static", max_num_seqs=3))
    assert got == expected, f"steps {got[:6]}..., expected {expected[:6]}..."


def play(policy, reqs: list) -> list[list[tuple[int, int]]]:
    """Run requests to completion with a policy on the Request counters; -> each step's plan."""
    running, waiting, steps = [], deque(reqs), []
    while running or waiting:
        batch = policy(running, waiting)
        steps.append(plan(batch))
        assert len(steps) < 500, "the requests never finish (500 steps)"
        for r, n in batch:
            r.computed += n
            if r.computed == r.length:
                r.generated += 1
        running[:] = [r for r in running if not r.done]
    return steps


class RoomyCache:
    """A cache manager that always has room: the scheduler's decisions then depend on the budget only."""

    def allocate(self, seq):
        return 0

    def reserve(self, seq, n):
        return True

    def holds(self, seq, n):
        return True

    def computed(self, seq):
        pass

    def free(self, seq):
        pass


def sequence(rid: int, prompt_len: int, computed: int = 0, generated: int = 0) -> Sequence:
    seq = Sequence(str(rid), None, [1] * prompt_len, SamplingParams(), None, None, ())
    seq.token_ids += [1] * generated
    seq.num_computed_tokens = computed
    return seq


def play_minillm(specs, config: EngineConfig) -> list[list[tuple[int, int]]]:
    scheduler = Scheduler(config, RoomyCache())
    outputs = {}
    for i, (p, o) in enumerate(specs):
        scheduler.add(sequence(i, p))
        outputs[str(i)] = o
    steps = []
    while scheduler.has_unfinished():
        batch = scheduler.schedule(0.0)
        steps.append([(int(b.seq.request_id), b.num_tokens) for b in batch])
        for seq, _ in scheduler.advance(batch):
            seq.token_ids.append(1)
            if len(seq.output_token_ids) >= outputs[seq.request_id]:
                scheduler.finish(seq, FinishReason.LENGTH)
    return steps


@exercise("4.2")
def test_prefill_chunks_fill_the_budget_left_by_decodes(lab):
    """chunks are budget - decodes tokens, the last one the remainder, summing to the prompt"""
    for prompt_len, budget, decodes, expected in ((100, 32, 6, [26, 26, 26, 22]), (52, 16, 3, [13] * 4),
                                                  (5, 64, 0, [5]), (7, 3, 2, [1] * 7), (41, 11, 1, [10] * 4 + [1])):
        got = list(lab.prefill_chunks(prompt_len, budget, decodes))
        assert got == expected, (f"prefill_chunks({prompt_len}, budget={budget}, num_decodes={decodes}) = {got}, "
                                 f"expected {expected}")


@exercise("4.2")
def test_prefill_chunks_refuse_a_budget_with_no_room(lab):
    """a budget the decodes use up entirely raises ValueError"""
    for budget, decodes in ((8, 8), (4, 9)):
        try:
            lab.prefill_chunks(30, budget, decodes)
        except ValueError:
            continue
        raise AssertionError(f"prefill_chunks(30, budget={budget}, num_decodes={decodes}) did not raise ValueError")


def reference_step(specs_running, specs_waiting, budget: int, max_num_seqs: int, chunked: bool):
    """minillm's Scheduler on the same state: -> plan, running ids, waiting ids."""
    config = EngineConfig(scheduler="continuous", max_num_seqs=max_num_seqs, max_num_batched_tokens=budget,
                          enable_chunked_prefill=chunked)
    scheduler = Scheduler(config, RoomyCache())
    for rid, p, o, c, g in specs_running:
        seq = sequence(rid, p, c, g)
        seq.status = SequenceStatus.RUNNING
        scheduler.running.append(seq)
    for rid, p, o, c, g in specs_waiting:
        scheduler.add(sequence(rid, p, c, g))
    batch = scheduler.schedule(0.0)
    return ([(int(b.seq.request_id), b.num_tokens) for b in batch], [int(s.request_id) for s in scheduler.running],
            [int(s.request_id) for s in scheduler.waiting])


def lab_step(lab, specs_running, specs_waiting, budget, max_num_seqs, chunked):
    running = [lab.Request(rid, p, o, computed=c, generated=g) for rid, p, o, c, g in specs_running]
    waiting = deque(lab.Request(rid, p, o, computed=c, generated=g) for rid, p, o, c, g in specs_waiting)
    got = plan(lab.continuous_step(running, waiting, budget, max_num_seqs, chunked))
    return got, rids(running), rids(waiting)


def check_step(lab, running, waiting, budget, max_num_seqs, chunked, what):
    got = lab_step(lab, running, waiting, budget, max_num_seqs, chunked)
    expected = reference_step(running, waiting, budget, max_num_seqs, chunked)
    for name, g, e in zip(("the step's plan", "running after the step", "waiting after the step"), got, expected):
        assert g == e, f"{what}: {name} is {g}, expected {e}"


DECODING = [(0, 10, 9, 10, 1), (1, 6, 9, 6, 1), (2, 20, 9, 21, 2)]  # (rid, prompt, output, computed, generated)


@exercise("4.3")
def test_running_decodes_go_before_new_prompts(lab):
    """three decodes are scheduled first; a waiting prompt gets the rest of the budget, chunked"""
    check_step(lab, DECODING, [(3, 40, 5, 0, 0)], 16, 8, True, "3 decodes + a 40-token prompt, budget 16, chunked")


@exercise("4.3")
def test_a_step_may_use_exactly_the_whole_budget(lab):
    """a prompt that fits the budget left exactly is admitted whole, unchunked"""
    check_step(lab, DECODING, [(3, 13, 5, 0, 0), (4, 1, 5, 0, 0)], 16, 8, False,
               "3 decodes + a 13-token prompt, budget 16, unchunked")
    check_step(lab, DECODING, [(3, 14, 5, 0, 0), (4, 1, 5, 0, 0)], 16, 8, False,
               "3 decodes + a 14-token prompt, budget 16, unchunked")


@exercise("4.3")
def test_a_long_prompt_runs_alone_when_unchunked(lab):
    """unchunked, a prompt over the budget runs alone in an empty step, and blocks the queue otherwise"""
    check_step(lab, [], [(0, 50, 3, 0, 0), (1, 4, 3, 0, 0)], 16, 8, False, "an empty step, a 50-token prompt, budget 16")
    check_step(lab, [(0, 50, 9, 0, 0), (1, 6, 9, 6, 1)], [(2, 3, 3, 0, 0)], 16, 8, False,
               "a running unfinished 50-token prompt behind nothing, a decode, budget 16, unchunked")


@exercise("4.3")
def test_max_num_seqs_caps_admission(lab):
    """no more than max_num_seqs requests run, however much budget is left"""
    check_step(lab, DECODING, [(3, 4, 5, 0, 0), (4, 4, 5, 0, 0)], 100, 4, True, "3 running, max_num_seqs 4")


@exercise("4.3")
def test_continuous_steps_match_minillm_on_random_states(lab):
    """200 random states (decodes, half-done prefills, preempted requests, odd budgets): the same decisions as minillm"""
    rng = random.Random(43)
    for case in range(200):
        running, waiting, rid = [], [], 0
        for _ in range(rng.randint(0, 6)):
            p, g = rng.randint(1, 40), rng.randint(0, 5)
            c = p + g - 1 if g else rng.randint(0, p - 1)  # decoding, or part way through its prompt
            running.append((rid, p, 50, c, g))
            rid += 1
        for _ in range(rng.randint(0, 5)):
            p, g = rng.randint(1, 40), rng.choice([0, 0, 0, 3])  # some were preempted after generating
            waiting.append((rid, p, 50, 0, g))
            rid += 1
        budget, max_num_seqs, chunked = rng.randint(1, 60), rng.randint(1, 9), rng.random() < 0.6
        check_step(lab, running, waiting, budget, max_num_seqs, chunked,
                   f"random state {case} (budget {budget}, max_num_seqs {max_num_seqs}, chunked {chunked})")


@exercise("4.3")
def test_continuous_workload_plays_out_like_minillm(lab):
    """a whole workload, chunked with budget 12 and 3 seqs, then unchunked with budget 30, takes minillm's steps"""
    specs = [(5, 3), (17, 6), (4, 1), (29, 2), (3, 5), (8, 4), (6, 2)]
    for budget, chunked in ((12, True), (30, False)):
        got = play(lambda run, wait: lab.continuous_step(run, wait, budget, 3, chunked),
                   [lab.Request(i, p, o) for i, (p, o) in enumerate(specs)])
        expected = play_minillm(specs, EngineConfig(max_num_seqs=3, max_num_batched_tokens=budget,
                                                    enable_chunked_prefill=chunked))
        assert got == expected, f"budget {budget}, chunked {chunked}: steps {got[:5]}..., expected {expected[:5]}..."


def preemption_case(lab, computed: list[int]):
    running = [lab.Request(i, 50, 10, computed=c) for i, c in enumerate(computed)]
    waiting = deque([lab.Request(9, 5, 5)])
    return running, waiting


@exercise("4.4")
def test_preemption_takes_the_newest_until_enough_is_free(lab):
    """victims are taken from the newest end, just enough of them, and go to the queue's front oldest first"""
    for needed, free, expected in ((6, 1, [3]), (9, 1, [3, 2, 1]), (6, 6, []), (7, 1, [3, 2])):
        running, waiting = preemption_case(lab, [40, 17, 9, 33])  # blocks of 8: 5, 3, 2, 5
        victims = lab.preempt_for(running[0], needed, running, waiting, free, 8)
        got = [r.rid for r in victims]
        assert got == expected, f"{needed} blocks needed, {free} free: preempted {got}, expected {expected}"
        left = [i for i in range(4) if i not in expected]
        assert rids(running) == left, f"{needed} needed, {free} free: running {rids(running)} after, expected {left}"
        assert rids(waiting) == expected[::-1] + [9], \
            f"{needed} needed, {free} free: waiting {rids(waiting)}, expected the victims in front, oldest first"
        assert all(r.computed == 0 for r in victims), "a victim keeps computed > 0; its K/V are gone"


@exercise("4.4")
def test_preemption_stops_after_the_needy_request_itself(lab):
    """when the needy request is the newest left, it is preempted and nothing older is"""
    running, waiting = preemption_case(lab, [40, 17, 9, 33])
    got = [r.rid for r in lab.preempt_for(running[2], 10, running, waiting, 0, 8)]
    assert got == [3, 2], f"request 2 needing 10 blocks, 0 free: preempted {got}, expected [3, 2]"
    assert rids(running) == [0, 1], f"running {rids(running)} after, expected [0, 1]"


@exercise("4.4")
def test_preemption_counts_partial_blocks(lab):
    """a victim frees ceil(computed / block_size) blocks, partial last block included"""
    running, waiting = preemption_case(lab, [16, 8, 9])  # block size 4: 4, 2, 3 blocks
    got = [r.rid for r in lab.preempt_for(running[0], 3, running, waiting, 0, 4)]
    assert got == [2], f"3 blocks needed, 0 free, newest holds 9 tokens (3 blocks of 4): preempted {got}, expected [2]"


def flat_reference(token_ids, computed, num_tokens, tables, block_size):
    """minillm's runner and paged cache on the same step: -> input_ids, positions, cu_seqlens, slot_mapping."""
    seqs = []
    for i, (ids, c, table) in enumerate(zip(token_ids, computed, tables)):
        seq = sequence(i, len(ids), c)
        seq.token_ids, seq.kv = list(ids), BlockTable(list(table))
        seqs.append(seq)
    batch = [ScheduledSeq(s, n, Phase.PREFILL, False) for s, n in zip(seqs, num_tokens)]
    ids, positions, _ = ModelRunner(None, None, torch.device("cpu")).prepare(batch)
    cfg = ModelConfig("LlamaForCausalLM", 64, 8, 8, 1, 1, 1, 4, 256)
    cache = PagedCacheManager(cfg, 1 + max(max(t) for t in tables), block_size, torch.float32, torch.device("cpu"), False)
    slots = cache.context(batch).slot_mapping
    cu = torch.tensor([0] + list(num_tokens)).cumsum(0)
    return ids, positions, cu, slots


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
    """prefills, later chunks and decodes of several sequences: ids, positions, cu_seqlens, slots as minillm builds them"""
    for seed in range(451, 471):
        step = random_step(seed)
        got = lab.flatten_batch(*step)
        assert isinstance(got, tuple) and len(got) == 4, "flatten_batch returns a tuple of 4 tensors"
        for name, g, e in zip(("input_ids", "positions", "cu_seqlens", "slot_mapping"), got, flat_reference(*step)):
            assert isinstance(g, torch.Tensor), f"{name} is a {type(g).__name__}, not a tensor"
            assert g.tolist() == e.tolist(), (f"step {seed - 450} (block size {step[4]}, computed {step[1]}, "
                                              f"tokens {step[2]}): {name} {g.tolist()}, expected {e.tolist()}")


@exercise("4.5")
def test_flatten_batch_offsets_positions_of_a_chunk(lab):
    """a chunk starting at token 4 and a decode at token 9 get their absolute positions"""
    ids, positions, cu, slots = lab.flatten_batch([list(range(10, 20)), list(range(30, 40))], [4, 9], [3, 1],
                                                  [[6, 2, 7], [1, 5, 0]], 4)
    assert ids.tolist() == [14, 15, 16, 39], f"input_ids {ids.tolist()}, expected [14, 15, 16, 39]"
    assert positions.tolist() == [4, 5, 6, 9], f"positions {positions.tolist()}, expected [4, 5, 6, 9]"
    assert cu.tolist() == [0, 3, 4], f"cu_seqlens {cu.tolist()}, expected [0, 3, 4]"
    assert slots.tolist() == [8, 9, 10, 1], f"slot_mapping {slots.tolist()}, expected [8, 9, 10, 1]"
    assert all(t.dtype == torch.int64 for t in (ids, positions, cu, slots)), "the tensors are not all int64"
