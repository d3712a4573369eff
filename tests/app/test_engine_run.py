"""EngineRun: the background driver the pages read from."""
import time

from minillm import EngineConfig, SamplingParams
from minillm.cache.allocator import BlockAllocator
from minillm.config import Components
from minillm.engine.engine import LLMEngine
from minillm_visualizer.shared.engine_run import EngineRun, RequestSpec


def engine(**kw) -> LLMEngine:
    return LLMEngine(EngineConfig.from_knobs("pico", num_kv_blocks=64, **kw))


def specs(n: int, arrival_gap: float = 0.0, max_tokens: int = 12) -> list[RequestSpec]:
    return [RequestSpec(f"r{i}", "def add(a, b):", SamplingParams(max_tokens=max_tokens, temperature=0,
                                                                   ignore_eos=True), i * arrival_gap)
            for i in range(n)]


def test_latencies_are_the_engines_own():
    run = EngineRun(engine(), specs(3))
    assert run.wait(30) and run.status == "finished"
    _, samples = run.snapshot()
    for s in samples.values():
        assert len(s.token_times) == 12
        assert s.token_times[0] - s.arrival == s.metrics["ttft"]
    assert sum(r.event.output_tokens for r in run.records) == 36


def test_requests_arrive_at_their_times():
    run = EngineRun(engine(), specs(3, arrival_gap=0.3))
    assert list(run.samples) == ["r0"]
    assert run.wait(30)
    arrivals = [s.arrival - run.start_time for s in run.samples.values()]
    assert arrivals[1] >= 0.3 and arrivals[2] >= 0.6


def test_stop_aborts_the_rest_and_empties_the_pool():
    run = EngineRun(engine(), specs(4, max_tokens=200), pace=0.05)
    time.sleep(0.3)
    run.stop()
    assert run.status == "stopped" and not run.engine.has_unfinished()
    assert run.final_kv.used_blocks == 0
    assert {s.finish_reason for s in run.samples.values()} == {"abort"}


def test_a_refused_request_is_reported_and_the_others_run():
    bad = RequestSpec("big", "x", SamplingParams(max_tokens=5000))
    run = EngineRun(engine(), [bad, *specs(2)])
    assert run.wait(30) and run.status == "finished"
    assert run.rejected and run.rejected[0].startswith("big:")
    assert list(run.samples) == ["r0", "r1"]


def test_parallel_samples_are_tracked_apart():
    spec = RequestSpec("r0", "def add(a, b):", SamplingParams(max_tokens=8, n=2, seed=1))
    run = EngineRun(engine(), [spec])
    assert run.wait(30)
    assert list(run.samples) == ["r0.0", "r0.1"]
    assert all(len(s.token_times) == 8 for s in run.samples.values())


class FreeFails(BlockAllocator):
    """A broken part, as a learner's may be: it cannot give blocks back."""

    def free(self, table: list[int]) -> None:
        raise RuntimeError("free is broken")


def test_a_part_that_fails_while_freeing_still_ends_the_run_as_failed():
    broken = LLMEngine(EngineConfig.from_knobs("pico", num_kv_blocks=64,
                                               components=Components(block_allocator=FreeFails)))
    run = EngineRun(broken, [*specs(1, max_tokens=2), *specs(2, max_tokens=50)[1:]])
    assert run.wait(30), "the run must end, not hang in its clean-up"
    assert run.status == "failed" and run.error == "RuntimeError: free is broken"
    assert isinstance(run.exception, RuntimeError) and run.final_kv is not None
