"""AsyncLLM: the engine driven from an asyncio loop, for servers and concurrent clients.

    llm = AsyncLLM("tiny")
    async for chunk in llm.generate("def add(a, b):", SamplingParams(max_tokens=20), "req-1"):
        print(chunk.text, end="")
    await llm.abort("req-2")   # frees that request's blocks before the next step
    llm = AsyncLLM.from_engine(LLM("tiny").engine)   # drive an engine built elsewhere

The event loop never waits for a step. One engine thread owns the engine: it alone queues,
aborts and steps, and takes requests and aborts from a thread-safe inbox between two steps
(blocking on it when the engine is idle). Each step's chunks go back to the loop in one
call_soon_threadsafe, into a buffer per request, so a slow reader loses nothing. The stats a
server reads (kv_stats, num_waiting, num_running) come from the snapshot the thread publishes
after every step, so a /metrics scrape takes no lock either.
"""
import asyncio
import contextlib
import queue
import sys
import threading
import weakref
from collections import defaultdict
from collections.abc import AsyncIterator
from typing import NamedTuple

from minillm.config import EngineConfig
from minillm.engine.engine import LLMEngine
from minillm.models.registry import DEFAULT_MODEL
from minillm.outputs import StreamChunk
from minillm.sampling import SamplingParams
from minillm.state import KVStats

# A thread holding the GIL hands it to a waiting one only every switch interval (5 ms by default).
# A torch op releases the GIL while it computes, but the Python between ops (scheduling, sampling,
# detokenizing a large batch) can hold it for milliseconds, and each wake-up of the loop would wait
# up to the interval. The engine thread lowers it for the process: a forced switch costs
# microseconds, and happens only while another thread waits for the GIL.
SWITCH_INTERVAL = 0.0005


class RequestStream:
    """One request's chunks on their way to its reader: filled on its loop, in arrival order."""

    def __init__(self, request_id: str, loop: asyncio.AbstractEventLoop) -> None:
        self.request_id, self.loop = request_id, loop
        self.items: asyncio.Queue = asyncio.Queue()  # unbounded: a slow reader only lets it grow
        self.closed = False

    def push(self, item: StreamChunk | BaseException) -> None:
        if not self.closed:
            self.items.put_nowait(item)

    def close(self, error: BaseException) -> None:
        """End the stream now: the reader gets `error`, then nothing more."""
        self.push(error)
        self.closed = True


class Snapshot(NamedTuple):
    """The engine as its thread left it after a step (or after taking requests and aborts)."""
    kv: KVStats
    waiting: int
    running: int
    taken: int  # requests taken from the inbox so far


class Add(NamedTuple):
    request: object  # EngineRequest (LLMEngine.process_request)
    stream: RequestStream


class Abort(NamedTuple):
    request_id: str
    stream: RequestStream | None        # set: only if that stream still owns the id (it left early)
    reply: tuple | None                 # (loop, future) for whether the request was still live


STOP = object()


def call_on(loop: asyncio.AbstractEventLoop, fn, *args) -> bool:
    """Run fn(*args) on loop's thread soon (now, on that loop itself); -> False if loop is closed."""
    try:
        if asyncio.get_running_loop() is loop:
            fn(*args)
            return True
    except RuntimeError:  # no loop runs in this thread: the engine thread
        pass
    try:
        loop.call_soon_threadsafe(fn, *args)
        return True
    except RuntimeError:  # that loop is closed: nobody is left to read
        return False


def push_all(items: list[tuple[RequestStream, StreamChunk | BaseException]]) -> None:
    for stream, item in items:
        stream.push(item)


def resolve(future: asyncio.Future, value) -> None:
    if not future.done():
        future.set_result(value)


class EngineThread:
    """The engine's only driver: queues requests and aborts from the inbox between two steps,
    steps while anything is unfinished, and sends each step's chunks to their streams' loops."""

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.submitted = self._taken = 0
        self._routes: dict[str, RequestStream] = {}  # the engine thread's own: requests it queued
        self.snapshot = self._snapshot()
        self._guard = threading.Lock()  # the thread's start and end only: never held while a step runs
        self._thread: threading.Thread | None = None

    def submit(self, message) -> None:
        with self._guard:
            self.inbox.put(message)
            if isinstance(message, Add):
                self.submitted += 1
            if self._thread is None:
                self._start()

    def stop(self) -> threading.Thread | None:
        """Ask the thread to abort every request and end; -> the thread to join (None if none runs)."""
        with self._guard:
            if self._thread is not None:
                self.inbox.put(STOP)
            return self._thread

    def _start(self) -> None:
        if sys.getswitchinterval() > SWITCH_INTERVAL:
            sys.setswitchinterval(SWITCH_INTERVAL)
        self._thread = threading.Thread(target=self._run, name="minillm-engine", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while self._take_messages():
                if self.engine.has_unfinished():
                    try:
                        chunks = self.engine.step()
                    except Exception as e:  # a broken step fails every open stream, loudly
                        self._fail_all(e)
                        continue
                    self._publish()
                    self._send(chunks)
        except BaseException as e:
            self._fail_all(RuntimeError(f"the engine thread died: {e!r}"))
            raise
        finally:
            with self._guard:  # whatever came after STOP (or the crash) goes to a fresh thread
                self._thread = None
                if not self.inbox.empty():
                    self._start()

    def _take_messages(self) -> bool:
        """Handle the inbox's messages (when idle, wait for the first); -> False at STOP."""
        replies, block, stopping, handled = [], not self.engine.has_unfinished(), False, False
        while not stopping:
            try:
                message = self.inbox.get(block)
            except queue.Empty:
                break
            block, handled = False, True
            if message is STOP:
                for request_id in list(self._routes):
                    self._abort(Abort(request_id, None, None))
                stopping = True
            elif isinstance(message, Add):
                self._add(message)
            else:
                replies.append((message.reply, self._abort(message)))
        if handled:
            self._publish()  # before the replies: an awaited abort sees its blocks freed
        for reply, found in replies:
            if reply is not None:
                call_on(reply[0], resolve, reply[1], found)
        return not stopping

    def _add(self, message: Add) -> None:
        self._taken += 1
        try:
            request_id = self.engine.enqueue(message.request)
        except Exception as e:  # the id got taken since it was processed
            self._push([(message.stream, e)])
            return
        self._routes[request_id] = message.stream

    def _abort(self, message: Abort) -> bool:
        if message.stream is not None and self._routes.get(message.request_id) is not message.stream:
            return False  # that stream's request already ended; the id may belong to a new one
        self._routes.pop(message.request_id, None)
        return self.engine.abort(message.request_id)

    def _send(self, chunks: list[StreamChunk]) -> None:
        items = []
        for chunk in chunks:
            stream = self._routes.get(chunk.request_id)
            if stream is not None:
                if chunk.request is not None:  # the request's last chunk
                    del self._routes[chunk.request_id]
                items.append((stream, chunk))
        unread = self._push(items)
        for stream in unread:
            self._abort(Abort(stream.request_id, stream, None))
        if unread:
            self._publish()

    def _fail_all(self, error: BaseException) -> None:
        streams, self._routes = self._routes, {}
        with contextlib.suppress(Exception):  # best effort: the engine may be what failed
            for request_id in {*streams, *(s.request_id for s in self.engine.sequences())}:
                self.engine.abort(request_id)  # every live request, so no step retries the failure
            self._publish()
        self._push([(stream, error) for stream in streams.values()])

    @staticmethod
    def _push(items: list[tuple[RequestStream, StreamChunk | BaseException]]) -> list[RequestStream]:
        """Hand the items to their streams, one call per loop; -> the streams whose loop is closed."""
        by_loop = defaultdict(list)
        for stream, item in items:
            by_loop[stream.loop].append((stream, item))
        return [stream for loop, batch in by_loop.items() if not call_on(loop, push_all, batch) for stream, _ in batch]

    def _publish(self) -> None:
        self.snapshot = self._snapshot()

    def _snapshot(self) -> Snapshot:
        return Snapshot(self.engine.kv_stats(), self.engine.num_waiting, self.engine.num_running, self._taken)


class AsyncLLM:
    def __init__(self, model: str | None = None, **config) -> None:
        self.config = EngineConfig(model=model or DEFAULT_MODEL, **config)
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
        weakref.finalize(self, self._core.stop).atexit = False  # dropped without shutdown: end the thread

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
        cannot abort by itself. A grammar compiles in a worker thread (the first can take a
        second); the rest (tokenizing, checks) is quick enough for the loop."""
        loop = asyncio.get_running_loop()
        stream = None if request_id is None else self._open(request_id, loop)  # the id is held meanwhile
        try:
            if getattr(params, "structured", None) is not None:
                request = await asyncio.to_thread(self.engine.process_request, prompt, params, request_id)
            else:
                request = self.engine.process_request(prompt, params, request_id)
        except BaseException:
            if stream is not None:
                self._forget(stream)
            raise
        stream = stream or self._open(request.request_id, loop)
        if not stream.closed:  # else aborted while its grammar compiled: nothing to queue
            self._core.submit(Add(request, stream))
        return self._read(stream)

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
    def num_running(self) -> int:
        return self._core.snapshot.running

    def kv_stats(self) -> KVStats:
        """The KV pool as the latest step left it (or the latest requests and aborts taken)."""
        return self._core.snapshot.kv
