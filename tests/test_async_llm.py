"""AsyncLLM: concurrent streams from one engine, and abort."""
import asyncio

import pytest

from minillm import LLM, AsyncLLM, SamplingParams

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
    assert llm.engine.kv_stats().used_blocks == 0 and not llm.engine.has_unfinished()


def test_leaving_a_stream_early_aborts_the_request(hf_llama):
    llm = AsyncLLM(str(hf_llama[0]))

    async def main():
        stream = llm.generate([5, 6], SamplingParams(max_tokens=100, **GREEDY))
        async for _ in stream:
            break
        await stream.aclose()

    asyncio.run(main())
    assert not llm.engine.has_unfinished() and llm.engine.kv_stats().used_blocks == 0


def test_bad_request_raises_before_queueing(hf_llama):
    llm = AsyncLLM(str(hf_llama[0]))

    async def main():
        async for _ in llm.generate("", SamplingParams()):
            pass

    with pytest.raises(ValueError, match="prompt is empty"):
        asyncio.run(main())
    assert not llm.engine.has_unfinished()
