"""AsyncLLM: concurrent streams from one engine, abort, shutdown, and an engine thread that the
event loop never waits for."""
import asyncio
import threading

import pytest

from minillm import LLM, AsyncLLM, SamplingParams
from minillm.structured.output_spec import StructuredOutput
from minillm.testing import wait_until

GREEDY = dict(temperature=0, ignore_eos=True)


def test_concurrent_streams_match_offline_generation(hf_llama):
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8], [9] * 20]
    params = SamplingParams(max_tokens=15, **GREEDY)
    expected = [o.token_ids for o in LLM(str(hf_llama[0])).generate(prompts, params)]
    llm = AsyncLLM(str(hf_llama[0]))
    steps = []
    llm.engine.subscribe(lambda e: steps.append(len(e.scheduled)))

    async def collect(prompt, rid):
        tokens, text, final = [], "", None
        async for chunk in llm.generate(prompt, params, rid):
            tokens += chunk.token_ids
            text += chunk.text
            final = chunk.request
        assert text == final.text
        return tokens

    async def main():
        return await asyncio.gather(*(collect(p, f"r{i}") for i, p in enumerate(prompts)))

    assert asyncio.run(main()) == expected
    assert max(steps) == 3  # the three requests shared steps


def test_abort_frees_blocks_at_once_and_ends_the_stream(hf_llama):
    llm = AsyncLLM(str(hf_llama[0]))

    async def main():
        got = []

        async def consume():
            async for chunk in llm.generate([1, 2, 3], SamplingParams(max_tokens=200, **GREEDY), "long"):
                got.append(chunk)

        task = asyncio.create_task(consume())
        while len(got) < 3:
            await asyncio.sleep(0.005)
        assert await llm.abort("long")
        with pytest.raises(asyncio.CancelledError):
            await task
        return got

    got = asyncio.run(main())
    assert 3 <= len(got) < 200
    assert llm.engine.view.kv_stats().used_blocks == 0 and not llm.engine.has_unfinished()


def test_leaving_a_stream_early_aborts_the_request(hf_llama):
    llm = AsyncLLM(str(hf_llama[0]))

    async def main():
        stream = llm.generate([5, 6], SamplingParams(max_tokens=100, **GREEDY))
        async for _ in stream:
            break
        await stream.aclose()

    asyncio.run(main())
    assert not llm.engine.has_unfinished() and llm.engine.view.kv_stats().used_blocks == 0


def test_bad_request_raises_before_queueing(hf_llama):
    llm = AsyncLLM(str(hf_llama[0]))

    async def main():
        async for _ in llm.generate("", SamplingParams()):
            pass

    with pytest.raises(ValueError, match="prompt is empty"):
        asyncio.run(main())
    assert not llm.engine.has_unfinished()


def engine_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "minillm-engine"]


class HeldSteps:
    """Every step of the engine first waits for `go` (at most 10 s): the test acts while the
    engine thread is busy in a step. `timed_out`: a step had to stop waiting on its own."""

    def __init__(self, engine) -> None:
        self.entered, self.go, self.timed_out = threading.Event(), threading.Event(), False
        step = engine.step

        def held():
            self.entered.set()
            self.timed_out |= not self.go.wait(timeout=10)
            return step()
        engine.step = held


async def tokens_of(stream) -> list[int]:
    return [t async for chunk in stream for t in chunk.token_ids]


def test_start_abort_and_stats_answer_while_a_step_runs(hf_llama):
    llm = AsyncLLM(str(hf_llama[0]))
    held = HeldSteps(llm.engine)
    params = SamplingParams(max_tokens=8, **GREEDY)

    async def main():
        first = asyncio.create_task(tokens_of(llm.generate([1, 2, 3], params, "a")))
        await asyncio.to_thread(held.entered.wait, 10)  # the engine thread is in a step now
        second = await llm.start([4, 5, 6], params, "b")  # queued for the engine thread, not waiting for it
        waiting, used = llm.num_waiting, llm.kv_stats().used_blocks
        aborting = asyncio.create_task(llm.abort("b"))  # b's add is still in the inbox
        await asyncio.sleep(0.05)
        assert not aborting.done()  # the engine thread answers between two steps
        held.go.set()
        with pytest.raises(asyncio.CancelledError):
            await tokens_of(second)
        return waiting, used, await aborting, await first

    waiting, used, aborted, first = asyncio.run(main())
    assert not held.timed_out  # nothing above waited for the step to end
    assert (waiting, used) == (2, 0)  # a not yet scheduled, b in the inbox; no blocks yet
    assert aborted and len(first) == 8
    assert llm.engine.view.kv_stats().used_blocks == 0 and not llm.engine.has_unfinished()


def test_a_slow_reader_loses_no_chunk(hf_llama):
    params = SamplingParams(max_tokens=20, **GREEDY)
    expected = LLM(str(hf_llama[0])).generate([[7, 8, 9]], params)[0].token_ids
    llm = AsyncLLM(str(hf_llama[0]))

    async def main():
        stream = await llm.start([7, 8, 9], params, "slow")
        while llm.num_waiting or llm.num_running:  # every step ran before the reader reads at all
            await asyncio.sleep(0.01)
        return await tokens_of(stream)

    assert asyncio.run(main()) == expected


def test_shutdown_ends_every_stream_and_the_engine_thread(hf_llama):
    llm = AsyncLLM(str(hf_llama[0]))
    params = SamplingParams(max_tokens=200, **GREEDY)

    before = set(engine_threads())  # other tests' engines may still be winding down

    async def main():
        streams = [await llm.start([i, 2, 3], params, f"s{i}") for i in range(1, 3)]
        readers = [asyncio.create_task(tokens_of(s)) for s in streams]
        while llm.num_running < 2:
            await asyncio.sleep(0.005)
        mine = set(engine_threads()) - before
        await llm.shutdown()
        outcomes = await asyncio.gather(*readers, return_exceptions=True)
        assert all(isinstance(o, asyncio.CancelledError) for o in outcomes)
        assert len(mine) == 1 and not any(t.is_alive() for t in mine)
        assert llm.engine.view.kv_stats().used_blocks == 0
        again = await tokens_of(llm.generate([5, 6], SamplingParams(max_tokens=3, **GREEDY)))  # a new thread
        mine |= set(engine_threads()) - before
        await llm.shutdown()
        return again, mine

    again, mine = asyncio.run(main())
    assert len(again) == 3 and len(mine) == 2 and not any(t.is_alive() for t in mine)
    assert not llm.engine.has_unfinished()


# (the exception's class and argument: an instance made here would live in the module, and once raised its
# traceback would hold the test's engine and its 512 MB KV pool for the rest of the run)
@pytest.mark.parametrize("error, message", [
    ((RuntimeError, "boom"), "boom"),
    pytest.param((SystemExit, "gone"), "the engine thread died: SystemExit('gone')",  # the thread ends, loudly
                 marks=pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")),
])
def test_a_failing_step_fails_every_open_stream_and_the_engine_recovers(hf_llama, error, message):
    llm = AsyncLLM(str(hf_llama[0]))
    step, broke = llm.engine.step, []

    def breaks_once_all_three_run():
        if llm.engine.view.num_running == 3 and not broke:
            broke.append(True)
            raise error[0](error[1])
        return step()
    llm.engine.step = breaks_once_all_three_run
    params = SamplingParams(max_tokens=50, **GREEDY)

    async def main():
        readers = [asyncio.create_task(tokens_of(llm.generate([i, 2], params))) for i in range(1, 4)]
        outcomes = await asyncio.gather(*readers, return_exceptions=True)
        assert all(isinstance(o, RuntimeError) and str(o) == message for o in outcomes), outcomes
        assert llm.kv_stats().used_blocks == 0
        return await tokens_of(llm.generate([4, 5], SamplingParams(max_tokens=4, **GREEDY)))

    assert len(asyncio.run(main())) == 4
    assert llm.engine.view.kv_stats().used_blocks == 0
    asyncio.run(llm.shutdown())  # its live thread holds the engine, whose patched step holds llm: a cycle gc cannot end


def test_one_llm_serves_one_event_loop_after_another(hf_llama):
    llm = AsyncLLM(str(hf_llama[0]))
    params = SamplingParams(max_tokens=100, **GREEDY)

    async def leaves_a_stream_open():
        stream = llm.generate([1, 2, 3], params, "open")
        await anext(stream)  # asyncio.run closes it when this loop ends: that aborts the request

    aborted, abort = [], llm.engine.abort  # the engine thread's aborts: (request id, whether it was live)
    llm.engine.abort = lambda request_id: aborted.append((request_id, abort(request_id))) or aborted[-1][1]
    asyncio.run(leaves_a_stream_open())
    # Closing the stream queues the abort; asyncio.run's teardown cancels the wait for its reply, and the
    # engine thread takes it between two steps, maybe after asyncio.run has returned.
    assert wait_until(lambda: aborted, 10) and aborted == [("open", True)]
    assert not llm.engine.has_unfinished() and llm.engine.view.kv_stats().used_blocks == 0
    assert len(asyncio.run(tokens_of(llm.generate([1, 2, 3], SamplingParams(max_tokens=5, **GREEDY), "open")))) == 5


def test_request_ids_stay_unique_while_in_flight(hf_llama):
    llm = AsyncLLM(str(hf_llama[0]))
    params = SamplingParams(max_tokens=5, **GREEDY)

    async def main():
        stream = await llm.start([1, 2], params, "x")
        with pytest.raises(ValueError, match="request id 'x' is already in use"):
            await llm.start([3, 4], params, "x")
        await tokens_of(stream)
        return await tokens_of(await llm.start([3, 4], params, "x"))  # free again once read to its end

    assert len(asyncio.run(main())) == 5


def test_requests_are_tokenized_and_grammars_compiled_off_the_event_loop(hf_llama):
    """A long prompt's tokenization, like a grammar's compilation, would stall every open stream."""
    llm = AsyncLLM(str(hf_llama[0]))
    process, threads = llm.engine.process_request, []

    def recording(*args):
        threads.append(threading.current_thread())
        return process(*args)
    llm.engine.process_request = recording
    regex = SamplingParams(max_tokens=5, structured=StructuredOutput(regex="[a-z]+"), seed=0)

    async def main():
        await tokens_of(llm.generate([1, 2], SamplingParams(max_tokens=2)))
        await tokens_of(llm.generate([1, 2], regex))
        with pytest.raises(ValueError, match="cannot be compiled"):
            await llm.start([1, 2], SamplingParams(structured=StructuredOutput(regex="[a-")))

    asyncio.run(main())
    main_thread = threading.main_thread()
    assert len(threads) == 3 and main_thread not in threads
