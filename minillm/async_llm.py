"""AsyncLLM: the engine driven from an asyncio loop, for servers and concurrent clients.

    llm = AsyncLLM("tiny")
    async for chunk in llm.generate("def add(a, b):", SamplingParams(max_tokens=20), "req-1"):
        print(chunk.text, end="")
    await llm.abort("req-2")   # frees that request's blocks before the next step
    llm = AsyncLLM.from_engine(LLM("tiny").engine)   # drive an engine built elsewhere

The event loop never waits for a step. One engine thread owns the engine (engine/engine_thread.py):
it alone queues, aborts and steps, and takes requests and aborts from a thread-safe inbox between
two steps (blocking on it when the engine is idle). Each step's chunks go back to the loop in one
call_soon_threadsafe, into a buffer per request, so a slow reader loses nothing. The stats a
server reads (kv_stats, num_waiting, num_running) come from the snapshot the thread publishes
after every step, so a /metrics scrape takes no lock either. This side validates a request before
anything is queued (in a worker thread: tokenizing, a grammar) and holds the open streams.
"""
import asyncio
import contextlib
import weakref
from collections.abc import AsyncIterator

import torch

from minillm.config import EngineConfig
from minillm.engine.engine import LLMEngine
from minillm.engine.engine_thread import STOP, Abort, Add, EngineThread, RequestStream, call_on
from minillm.engine.runner import full_forward_logits
from minillm.outputs import StreamChunk
from minillm.sampling import SamplingParams
from minillm.sequence import EngineRequest
from minillm.step import KVStats


class AsyncLLM:
    """The engine behind an asyncio loop: generate() is an async iterator of StreamChunks, abort() stops a
    request; an engine thread owns the engine, so concurrent callers (a server's requests) never wait for a
    step on the loop."""
    def __init__(self, model: str | None = None, **config) -> None:
        self.config = EngineConfig.from_knobs(model, **config)
        self._attach(LLMEngine(self.config))

    @classmethod
    def from_engine(cls, engine: LLMEngine) -> "AsyncLLM":
        """Drive an engine that already exists (an LLM's, with its loaded weights and knobs). Nothing
        else may step it meanwhile: this object's engine thread is then its only driver."""
        llm = cls.__new__(cls)
        llm.config = engine.config
        llm._attach(engine)
        return llm

    def _attach(self, engine: LLMEngine) -> None:
        self.engine = engine
        self._core = EngineThread(engine)
        self._streams: dict[str, RequestStream] = {}  # the open requests, by id (only loops touch it)
        # Dropped without shutdown: end the thread. The callback holds only the inbox: holding the EngineThread
        # (its engine, and whatever that references, maybe this object) would keep them all alive for good.
        weakref.finalize(self, self._core.inbox.put, STOP).atexit = False

    async def generate(self, prompt: str | list[int], params: SamplingParams | None = None,
                       request_id: str | None = None) -> AsyncIterator[StreamChunk]:
        """Stream the request's chunks as steps produce them. Bad input raises ValueError before
        anything is queued. Leaving the loop early (break, cancel, client gone) aborts it."""
        async with contextlib.aclosing(await self.start(prompt, params, request_id)) as stream:
            async for chunk in stream:
                yield chunk

    async def start(self, prompt: str | list[int], params: SamplingParams | None = None,
                    request_id: str | None = None) -> AsyncIterator[StreamChunk]:
        """Validate the request and queue it for the engine thread (bad input raises ValueError
        here, so a server can answer 400 before it starts a stream); -> the stream of its chunks.
        The caller must then iterate the stream or `abort(request_id)`: a stream never started
        cannot abort by itself."""
        return (await self.submit(prompt, params, request_id))[1]

    async def submit(self, prompt: str | list[int], params: SamplingParams | None = None,
                     request_id: str | None = None) -> tuple[EngineRequest, AsyncIterator[StreamChunk]]:
        """start(), and the request as processed (its prompt's token ids). Processing (tokenizing, the
        checks, compiling a grammar: the first takes a second) runs in a worker thread, so a long
        prompt never stalls the other streams; it is refused as soon as its length is known."""
        loop = asyncio.get_running_loop()
        stream = None if request_id is None else self._open(request_id, loop)  # the id is held meanwhile
        try:
            request = await asyncio.to_thread(self.engine.process_request, prompt, params, request_id)
        except BaseException:
            if stream is not None:
                self._forget(stream)
            raise
        stream = stream or self._open(request.request_id, loop)
        if not stream.closed:  # else aborted while it was processed: nothing to queue
            self._core.submit(Add(request, stream))
        return request, self._read(stream)

    def _open(self, request_id: str, loop: asyncio.AbstractEventLoop) -> RequestStream:
        if request_id in self._streams:
            raise ValueError(f"request id {request_id!r} is already in use")
        stream = self._streams[request_id] = RequestStream(request_id, loop)
        return stream

    def _forget(self, stream: RequestStream) -> None:
        if self._streams.get(stream.request_id) is stream:
            del self._streams[stream.request_id]

    async def _read(self, stream: RequestStream) -> AsyncIterator[StreamChunk]:
        finished = False
        try:
            while not finished:
                chunk = await stream.items.get()
                if isinstance(chunk, BaseException):
                    raise chunk
                finished = chunk.request is not None
                yield chunk
        finally:
            self._forget(stream)
            if not finished and not stream.closed:  # the reader left early: free its blocks
                stream.closed = True
                await self._engine_abort(stream.request_id, stream)

    async def abort(self, request_id: str) -> bool:
        """Stop a request: its stream ends now with no further chunks, and its blocks are free
        before the next step; -> whether it was still queued or running."""
        stream = self._streams.pop(request_id, None)
        if stream is not None:
            call_on(stream.loop, stream.close, asyncio.CancelledError(f"request {request_id} was aborted"))
        return await self._engine_abort(request_id, None)

    async def _engine_abort(self, request_id: str, stream: RequestStream | None) -> bool:
        """Have the engine thread abort the request between two steps; -> whether it was live."""
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        self._core.submit(Abort(request_id, stream, (loop, done)))
        return await done

    async def logits(self, token_ids: list[int]) -> torch.Tensor:
        """LLM.logits in a worker thread, beside the engine's steps (a forward writes no state):
        -> float32 logits [len, vocab]. Scoring a prompt this way never blocks the event loop."""
        engine = self.engine
        return await asyncio.to_thread(full_forward_logits, engine.model, token_ids, engine.max_model_len,
                                       engine.device)

    async def shutdown(self) -> None:
        """Abort every open request (their blocks are freed, their streams end) and stop the
        engine thread (the next request starts a new one)."""
        streams, self._streams = self._streams, {}
        for rid, stream in streams.items():
            call_on(stream.loop, stream.close, asyncio.CancelledError(f"request {rid} was aborted: shutdown"))
        thread = self._core.stop()
        if thread is not None:
            await asyncio.to_thread(thread.join)

    # -- what servers may read while a step runs: the engine thread's latest snapshot -------------
    @property
    def num_waiting(self) -> int:
        """Requests queued for their first step (or preempted), counting those still in the inbox."""
        snapshot = self._core.snapshot
        return snapshot.waiting + self._core.submitted - snapshot.taken

    @property
    def num_waiting_seqs(self) -> int:
        """Sequences queued (a request with n samples counts n), counting those still in the inbox."""
        snapshot = self._core.snapshot
        return snapshot.waiting_seqs + self._core.submitted_seqs - snapshot.taken_seqs

    @property
    def num_running(self) -> int:
        return self._core.snapshot.running

    def kv_stats(self) -> KVStats:
        """The KV pool as the latest step left it (or the latest requests and aborts taken)."""
        return self._core.snapshot.kv
