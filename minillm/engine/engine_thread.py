"""The engine thread: the only driver of an engine served from asyncio (minillm/async_llm.py).

It alone queues, aborts and steps. Requests and aborts reach it through a thread-safe inbox that it
drains between two steps (blocking on it when the engine is idle); each step's chunks go back to
their readers' loops in one call_soon_threadsafe per loop; after every step it publishes a snapshot
of the stats a server reads, so reading them takes no lock a step holds.

The thread is a daemon (a forgotten AsyncLLM never keeps a process alive), so at interpreter exit one
that is still running is stopped and joined first (stop_engine_threads): a daemon thread found inside a
step when the interpreter finalizes is ended as it takes the GIL back, from inside torch's C++ (a forced
unwind through a noexcept frame), and the process aborts with "terminate called without an active exception".
"""
import asyncio
import atexit
import contextlib
import logging
import queue
import sys
import threading
from collections import defaultdict
from typing import NamedTuple

from minillm.engine.engine import LLMEngine
from minillm.outputs import StreamChunk
from minillm.step import KVStats

# A thread holding the GIL hands it to a waiting one only every switch interval (5 ms by default).
# A torch op releases the GIL while it computes, but the Python between ops (scheduling, sampling,
# detokenizing a large batch) can hold it for milliseconds, and each wake-up of the loop would wait
# up to the interval. The engine thread lowers it for the process: a forced switch costs
# microseconds, and happens only while another thread waits for the GIL.
SWITCH_INTERVAL = 0.0005
log = logging.getLogger(__name__)


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
    waiting_seqs: int  # sequences queued: a waiting request counts its n samples
    taken_seqs: int  # sequences of the requests taken from the inbox so far


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
        self.submitted_seqs = self._taken_seqs = 0
        self._routes: dict[str, RequestStream] = {}  # the engine thread's own: requests it queued
        self.snapshot = self._snapshot()
        self._guard = threading.Lock()  # the thread's start and end only: never held while a step runs
        self._thread: threading.Thread | None = None
        self._exiting = False  # the interpreter exits (stop_at_exit): no thread starts any more

    def submit(self, message) -> None:
        with self._guard:
            self.inbox.put(message)
            if isinstance(message, Add):
                self.submitted += 1
                self.submitted_seqs += len(message.request.samples)
            if self._thread is None:
                self._start()

    def stop(self) -> threading.Thread | None:
        """Ask the thread to abort every request and end; -> the thread to join (None if none runs)."""
        with self._guard:
            if self._thread is not None:
                self.inbox.put(STOP)
            return self._thread

    def stop_at_exit(self) -> None:
        """Stop the running thread after its current step (its requests are aborted), wait for it, and start
        none from now on: a request submitted later (a server's daemon thread still serving) is never run."""
        with self._guard:
            self._exiting, thread = True, self._thread
            if thread is not None:
                self.inbox.put(STOP)
        if thread is not None:
            thread.join()

    def _start(self) -> None:
        if self._exiting:
            return
        if sys.getswitchinterval() > SWITCH_INTERVAL:
            sys.setswitchinterval(SWITCH_INTERVAL)
        self._thread = Driver(self)
        self._thread.start()

    def _run(self) -> None:
        try:
            while self._take_messages():
                if self.engine.has_unfinished():
                    try:
                        chunks = self.engine.step()
                    except Exception as e:
                        # The last resort, for a fault of the engine itself (the model's forward, the scheduler):
                        # what raises for one request's sake ends that request alone (engine/isolation.py).
                        log.exception("an engine step failed: every running request fails with it")
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
        self._taken_seqs += len(message.request.samples)
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
            for request_id in {*streams, *(s.request_id for s in self.engine.view.sequences())}:
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
        view = self.engine.view
        return Snapshot(view.kv_stats(), view.num_waiting, view.num_running, self._taken, view.num_waiting_seqs,
                        self._taken_seqs)


class Driver(threading.Thread):
    """The thread an EngineThread runs in, findable among the process's threads by stop_engine_threads."""

    def __init__(self, core: EngineThread) -> None:
        super().__init__(name="minillm-engine", daemon=True)
        self.core: EngineThread | None = core

    def run(self) -> None:
        try:
            self.core._run()
        finally:
            self.core = None  # a finished thread (a test may keep it) does not keep the engine alive


@atexit.register  # atexit runs while daemon threads still run normally: before the interpreter finalizes
def stop_engine_threads() -> None:
    """Stop every engine thread still running, each after its current step, and wait for it."""
    for driver in [t for t in threading.enumerate() if isinstance(t, Driver)]:
        if (core := driver.core) is not None:  # None: it has just ended
            core.stop_at_exit()
