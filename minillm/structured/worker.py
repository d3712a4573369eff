"""One daemon thread that runs submitted calls in order, each answering through a Future.

Grammar compiles run here rather than in a ThreadPoolExecutor because its threads are joined at
exit: a compile that a request stopped waiting for (xgrammar cannot be interrupted) would hold the
process open for minutes. One thread also bounds the machine a burst of grammar bombs can take.
"""
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future


class CompileWorker:
    def __init__(self) -> None:
        self._calls: queue.SimpleQueue[tuple[Future, Callable]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start = threading.Lock()

    def submit(self, call: Callable) -> Future:
        """-> the Future of call(), run after those submitted before it (started at the first submit)."""
        future: Future = Future()
        self._calls.put((future, call))
        with self._start:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True, name="minillm-grammar-compile")
                self._thread.start()
        return future

    def _run(self) -> None:
        while True:
            future, call = self._calls.get()
            if not future.set_running_or_notify_cancel():
                continue  # everyone stopped waiting before it started
            try:
                future.set_result(call())
            except BaseException as e:  # handed to the waiters, who raise it
                future.set_exception(e)
