"""One HTTP request's generation: its prompts queued in the engine, their chunks merged into one stream.

A completions request may carry several prompts (each an engine request, with n samples each);
they run side by side and their chunks arrive interleaved as (prompt index, chunk). Queueing is
separate from streaming so that bad input (a prompt too long for the context, an invalid schema)
is refused with a 400 before a streaming response has started.

Whoever stops reading early (a client that disconnects, a server shutting down) closes the stream,
and every request still running is aborted at once, so its KV blocks go back to the pool. A sample
whose constraints left it no token (finish_reason "error") ends the whole HTTP request with a 400; one the
engine failed on alone (engine/isolation.py), or a step that failed for everyone, with a 500. `cut()`
ends the stream from outside (the grace period of a shutdown is over): the reader gets the error.
"""
import asyncio
from collections.abc import AsyncIterator

from minillm.async_llm import AsyncLLM
from minillm.outputs import StreamChunk
from minillm.sampling import SamplingParams
from minillm.serve.errors import APIError
from minillm.serve.responses import usage


class Generation:
    def __init__(self, llm: AsyncLLM, request_id: str, on_chunk=None) -> None:
        """on_chunk(chunk): called for every chunk (the server's metrics)."""
        self.llm, self.request_id, self.on_chunk = llm, request_id, on_chunk
        self.streams: list[tuple[str, AsyncIterator[StreamChunk]]] = []
        self.prompt_tokens = self.completion_tokens = 0  # of the requests and samples finished so far
        self.queued_prompt_tokens = self.streamed_tokens = 0  # of every prompt queued, every token streamed
        self._queue: asyncio.Queue | None = None
        self._cut: APIError | None = None

    async def start(self, prompts: list[str | list[int]], params: SamplingParams) -> "Generation":
        """Queue every prompt; the first the engine refuses aborts those already queued -> 400."""
        try:
            for i, prompt in enumerate(prompts):
                rid = f"{self.request_id}-{i}"
                request, stream = await self.llm.submit(prompt, params, rid)
                self.streams.append((rid, stream))
                self.queued_prompt_tokens += len(request.prompt_token_ids)
        except BaseException as e:  # a prompt refused, or the client gone while a grammar compiled
            await asyncio.gather(*(self.llm.abort(rid) for rid, _ in self.streams))
            if not isinstance(e, ValueError):
                raise
            where = f" (prompt {len(self.streams)})" if len(prompts) > 1 else ""
            raise APIError(400, f"{e}{where}") from None
        return self

    async def chunks(self) -> AsyncIterator[tuple[int, StreamChunk]]:
        """(prompt index, chunk) as the engine makes them, until every prompt's request is finished."""
        queue = self._queue = asyncio.Queue()
        if self._cut is not None:
            queue.put_nowait((-1, self._cut))

        async def pump(i: int, stream: AsyncIterator[StreamChunk]) -> None:
            try:
                async for chunk in stream:
                    queue.put_nowait((i, chunk))
                queue.put_nowait((i, None))
            except BaseException as e:  # an abort (CancelledError) must reach the reader too
                queue.put_nowait((i, e))

        tasks = [asyncio.create_task(pump(i, stream)) for i, (_, stream) in enumerate(self.streams)]
        done: set[int] = set()
        try:
            while len(done) < len(tasks):
                i, item = await queue.get()
                if item is None:
                    done.add(i)
                elif isinstance(item, asyncio.CancelledError):
                    raise APIError(503, "the request was aborted: the server is shutting down")
                elif isinstance(item, APIError):
                    raise item
                elif isinstance(item, Exception):  # the engine thread's last resort: a step failed for everyone
                    raise APIError(500, f"the engine failed while serving this request: {type(item).__name__}: "
                                   f"{item}", code="engine_error") from item
                elif isinstance(item, BaseException):
                    raise item
                elif item.output is not None and item.output.error is not None:
                    # its constraints dead-ended (the client's: 400), or the engine failed on it alone (500)
                    raise APIError(500 if item.output.fault else 400, item.output.error,
                                   code="engine_error" if item.output.fault else None)
                else:
                    self._count(item)
                    yield i, item
        finally:
            for task in tasks:
                task.cancel()
            # a pump never started cannot abort its own request
            await asyncio.gather(*(self.llm.abort(rid) for i, (rid, _) in enumerate(self.streams) if i not in done))

    def cut(self, error: APIError) -> None:
        """End the stream from outside: its reader raises error next, and its requests are aborted."""
        self._cut = error
        if self._queue is not None:
            self._queue.put_nowait((-1, error))

    def usage(self) -> dict:
        return usage(self.prompt_tokens, self.completion_tokens)

    def usage_so_far(self) -> dict:
        """Every prompt's tokens, and the tokens streamed until now (vLLM's continuous_usage_stats)."""
        return usage(self.queued_prompt_tokens, self.streamed_tokens)

    def _count(self, chunk: StreamChunk) -> None:
        self.streamed_tokens += len(chunk.token_ids)
        if chunk.output is not None:
            self.completion_tokens += len(chunk.output.token_ids)
        if chunk.request is not None:
            self.prompt_tokens += len(chunk.request.prompt_token_ids)
        if self.on_chunk is not None:
            self.on_chunk(chunk)
