"""AsyncLLM: the engine driven from an asyncio loop, for servers and concurrent clients.

    llm = AsyncLLM("tiny")
    async for chunk in llm.generate("def add(a, b):", SamplingParams(max_tokens=20), "req-1"):
        print(chunk.text, end="")
    await llm.abort("req-2")   # frees that request's blocks before the next step

One background task loops over engine.step(), each step in a worker thread so the event loop
stays free to accept requests and stream tokens meanwhile. A lock keeps add/abort and the step
from touching the engine's queues at the same time.
"""
import asyncio
import threading
from collections.abc import AsyncIterator

from minillm.config import EngineConfig
from minillm.engine.engine import LLMEngine
from minillm.models.registry import DEFAULT_MODEL
from minillm.outputs import StreamChunk
from minillm.sampling import SamplingParams


class AsyncLLM:
    def __init__(self, model: str | None = None, **config) -> None:
        self.config = EngineConfig(model=model or DEFAULT_MODEL, **config)
        self.engine = LLMEngine(self.config)
        self._lock = threading.Lock()
        self._queues: dict[str, asyncio.Queue] = {}
        self._wake: asyncio.Event | None = None
        self._loop_task: asyncio.Task | None = None

    async def generate(self, prompt: str | list[int], params: SamplingParams | None = None,
                       request_id: str | None = None) -> AsyncIterator[StreamChunk]:
        """Stream the request's chunks as steps produce them. Bad input raises ValueError before
        anything is queued. Leaving the loop early (break, cancel, client gone) aborts it."""
        if request_id is not None and request_id in self._queues:
            raise ValueError(f"request id {request_id!r} is already in use")
        with self._lock:
            rid = self.engine.add_request(prompt, params, request_id)
        queue = self._queues[rid] = asyncio.Queue()
        self._ensure_loop()
        self._wake.set()
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
