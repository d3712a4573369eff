"""AsyncLLM: the engine driven from an asyncio loop, for servers and concurrent clients.

    llm = AsyncLLM("tiny")
    async for chunk in llm.generate("def add(a, b):", SamplingParams(max_tokens=20), "req-1"):
        print(chunk.text, end="")
    await llm.abort("req-2")   # frees that request's blocks before the next step
    llm = AsyncLLM.from_engine(LLM("tiny").engine)   # drive an engine built elsewhere

One background task loops over engine.step(), each step in a worker thread so the event loop
stays free to accept requests and stream tokens meanwhile. A lock keeps add/abort and the step
from touching the engine's queues at the same time.
"""
import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator

from minillm.config import EngineConfig
from minillm.engine.engine import LLMEngine
from minillm.models.registry import DEFAULT_MODEL
from minillm.outputs import StreamChunk
from minillm.sampling import SamplingParams
from minillm.state import KVStats


class AsyncLLM:
    def __init__(self, model: str | None = None, **config) -> None:
        self.config = EngineConfig(model=model or DEFAULT_MODEL, **config)
        self._attach(LLMEngine(self.config))

    @classmethod
    def from_engine(cls, engine: LLMEngine) -> "AsyncLLM":
        """Drive an engine that already exists (an LLM's, with its loaded weights and knobs). Nothing
        else may step it meanwhile: this object's loop is then its only driver."""
        llm = cls.__new__(cls)
        llm.config = engine.config
        llm._attach(engine)
        return llm

    def _attach(self, engine: LLMEngine) -> None:
        self.engine = engine
        self._lock = threading.Lock()
        self._queues: dict[str, asyncio.Queue] = {}
        self._wake: asyncio.Event | None = None
        self._loop_task: asyncio.Task | None = None

    async def generate(self, prompt: str | list[int], params: SamplingParams | None = None,
                       request_id: str | None = None) -> AsyncIterator[StreamChunk]:
        """Stream the request's chunks as steps produce them. Bad input raises ValueError before
        anything is queued. Leaving the loop early (break, cancel, client gone) aborts it."""
        async with contextlib.aclosing(self.start(prompt, params, request_id)) as stream:
            async for chunk in stream:
                yield chunk

    def start(self, prompt: str | list[int], params: SamplingParams | None = None,
              request_id: str | None = None) -> AsyncIterator[StreamChunk]:
        """Validate and queue the request now (bad input raises ValueError here, so a server can
        answer 400 before it starts a stream); -> the stream of its chunks. The caller must then
        iterate the stream or `abort(request_id)`: a stream never started cannot abort by itself."""
        if request_id is not None and request_id in self._queues:
            raise ValueError(f"request id {request_id!r} is already in use")
        with self._lock:
            rid = self.engine.add_request(prompt, params, request_id)
        queue = self._queues[rid] = asyncio.Queue()
        self._ensure_loop()
        self._wake.set()
        return self._stream(rid, queue)

    async def _stream(self, rid: str, queue: asyncio.Queue) -> AsyncIterator[StreamChunk]:
        finished = False
        try:
            while not finished:
                chunk = await queue.get()
                if isinstance(chunk, BaseException):
                    raise chunk
                finished = chunk.request is not None
                yield chunk
        finally:
            self._queues.pop(rid, None)
            if not finished:
                with self._lock:
                    self.engine.abort(rid)

    async def abort(self, request_id: str) -> bool:
        """Stop a request and free its blocks now; its stream ends with no further chunks."""
        with self._lock:
            aborted = self.engine.abort(request_id)
        queue = self._queues.pop(request_id, None)
        if queue is not None:
            queue.put_nowait(asyncio.CancelledError(f"request {request_id} was aborted"))
        return aborted

    async def shutdown(self) -> None:
        """Abort every open request (their blocks are freed, their streams end) and stop the loop."""
        for rid in list(self._queues):
            await self.abort(rid)
        if self._loop_task is not None:
            self._loop_task.cancel()
            self._loop_task = None

    # -- what servers may read while the loop runs ------------------------------------------
    @property
    def num_waiting(self) -> int:
        """Requests queued for their first step (or preempted). A length read needs no lock."""
        return self.engine.num_waiting

    @property
    def num_running(self) -> int:
        return self.engine.num_running

    def kv_stats(self) -> KVStats:
        """The KV pool between two steps (the lock keeps a step from changing it while it is read)."""
        with self._lock:
            return self.engine.kv_stats()

    def _ensure_loop(self) -> None:
        if self._loop_task is None or self._loop_task.done():
            self._wake = asyncio.Event()
            self._loop_task = asyncio.get_running_loop().create_task(self._run())

    def _step(self) -> list[StreamChunk]:
        with self._lock:
            return self.engine.step() if self.engine.has_unfinished() else []

    async def _run(self) -> None:
        while True:
            if not self.engine.has_unfinished():
                self._wake.clear()
                await self._wake.wait()
            try:
                chunks = await asyncio.to_thread(self._step)
            except Exception as e:  # a broken step fails every open stream, loudly
                for queue in self._queues.values():
                    queue.put_nowait(e)
                raise
            for chunk in chunks:
                queue = self._queues.get(chunk.request_id)
                if queue is not None:
                    queue.put_nowait(chunk)
