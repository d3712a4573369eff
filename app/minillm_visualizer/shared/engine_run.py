"""EngineRun: one engine stepped in a background thread and recorded as an event log.

The page never waits on the model. The thread admits requests at their arrival times, steps the
engine, and after every step appends a StepRecord: the engine's StepEvent plus what a page needs
to redraw that moment (each sample's state and block table). Pages read copies under the lock at
any step, so every view can run live, pause, step and scrub.
"""
import threading
import time
from dataclasses import dataclass, field

from minillm import SamplingParams
from minillm.engine.engine import LLMEngine
from minillm.outputs import StreamChunk
from minillm.step import KVStats, StepEvent


@dataclass
class RequestSpec:
    request_id: str
    prompt: str | list[int]
    params: SamplingParams
    arrival: float = 0.0          # seconds after the run starts


@dataclass
class SampleView:
    """One sample of one request, as the page shows it."""
    key: str                      # the request id, or "id.i" for sample i when n > 1
    request_id: str
    index: int
    prompt_tokens: int
    max_tokens: int
    arrival: float                # time.perf_counter() when the engine received it
    text: str = ""
    token_times: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    metrics: dict = field(default_factory=dict)   # the engine's own, once finished


@dataclass
class StepRecord:
    event: StepEvent
    states: dict[str, str]        # sample key -> prefill | decode | running | waiting | preempted
    tables: dict[str, list[int]]  # sample key -> block table (paged cache)


class EngineRun:
    """Drive `engine` through `specs`. States: running, paused, stopped, finished, failed."""

    def __init__(self, engine: LLMEngine, specs: list[RequestSpec], pace: float = 0.0) -> None:
        self.engine, self.pace = engine, pace
        self.samples: dict[str, SampleView] = {}
        self.records: list[StepRecord] = []
        self.rejected: list[str] = []       # requests the engine refused, with its reason
        self.final_kv: KVStats | None = None
        self.error: str | None = None       # what stopped a failed run, in words
        self.exception: Exception | None = None  # and the exception itself (the page shows where it came from)
        self.status = "running"
        self._pending = sorted(specs, key=lambda s: s.arrival)
        self._lock, self._wake = threading.Lock(), threading.Condition()
        self._stop, self._steps_allowed, self._paused_at, self._paused_total = False, 0, None, 0.0
        self._record: StepRecord | None = None
        engine.subscribe(self._observe)
        self.start_time = time.perf_counter()
        self._admit(0.0)  # requests due now are checked here, so a bad one is reported at once
        self._thread = threading.Thread(target=self._loop, name="engine-run", daemon=True)
        self._thread.start()

    # -- controls (called from the page) ---------------------------------------------------
    @property
    def active(self) -> bool:
        return self.status in ("running", "paused")

    def pause(self) -> None:
        with self._wake:
            if self.status == "running":
                self.status, self._paused_at = "paused", time.perf_counter()

    def resume(self) -> None:
        with self._wake:
            if self.status == "paused":
                self._paused_total += time.perf_counter() - self._paused_at
                self.status = "running"
                self._wake.notify_all()

    def step_once(self) -> None:
        """While paused: let the engine run exactly one more step."""
        with self._wake:
            if self.status == "paused":
                self._steps_allowed += 1
                self._wake.notify_all()

    def stop(self, timeout: float = 10.0) -> None:
        """End the run: every unfinished request is aborted and its blocks freed."""
        with self._wake:
            self._stop = True
            self._wake.notify_all()
        self._thread.join(timeout)

    def wait(self, timeout: float) -> bool:
        """Block until the run ends (for scripts and tests); -> whether it has."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def pending(self) -> int:
        """Requests whose arrival time has not come yet."""
        return len(self._pending)

    def snapshot(self) -> tuple[list[StepRecord], dict[str, SampleView]]:
        with self._lock:
            samples = {k: SampleView(**{**vars(s), "token_times": list(s.token_times)})
                       for k, s in self.samples.items()}
            return list(self.records), samples

    # -- the thread --------------------------------------------------------------------------
    def _loop(self) -> None:
        status = "finished"
        try:
            while self._next_turn():
                self._admit(self._clock(), force=self.status == "paused" and not self.engine.has_unfinished())
                if not self.engine.has_unfinished():
                    if not self._pending:
                        break
                    self._idle_until(self._pending[0].arrival)
                    continue
                self._step()
                if self.pace:
                    with self._wake:
                        self._wake.wait_for(lambda: self._stop, self.pace)
            if self._stop:
                status = "stopped"
        except Exception as exc:  # an engine bug, or a learner's part, must reach the page, not vanish with the thread
            self._fail(exc)
        finally:
            self._release()
            self.status = "failed" if self.exception is not None else status

    def _fail(self, exc: Exception) -> None:
        if self.exception is None:  # the first failure is the one to explain
            self.error, self.exception = f"{type(exc).__name__}: {exc}", exc

    def _next_turn(self) -> bool:
        """Wait while paused (unless a single step was asked for); -> False once stopped."""
        with self._wake:
            self._wake.wait_for(lambda: self._stop or self.status != "paused" or self._steps_allowed)
            if self._stop:
                return False
            if self.status == "paused":
                self._steps_allowed -= 1
            return True

    def _clock(self) -> float:
        """Seconds since the start, paused time excluded: arrivals do not come while paused."""
        paused = self._paused_total + (time.perf_counter() - self._paused_at if self.status == "paused" else 0)
        return time.perf_counter() - self.start_time - paused

    def _idle_until(self, arrival: float) -> None:
        with self._wake:
            self._wake.wait_for(lambda: self._stop or self.status == "paused",
                                max(0.0, arrival - self._clock()))

    def _admit(self, now: float, force: bool = False) -> None:
        """Hand the engine every request whose arrival time has come (the next one, if forced)."""
        while self._pending and (self._pending[0].arrival <= now or force):
            spec, force = self._pending.pop(0), False
            try:
                self.engine.add_request(spec.prompt, spec.params, request_id=spec.request_id)
            except ValueError as exc:
                self.rejected.append(f"{spec.request_id}: {exc}")
                continue
            seq = next(s for s in self.engine.view.sequences() if s.request_id == spec.request_id)
            n = spec.params.n
            with self._lock:
                for i in range(n):
                    key = spec.request_id if n == 1 else f"{spec.request_id}.{i}"
                    self.samples[key] = SampleView(key, spec.request_id, i, seq.num_prompt_tokens,
                                                   spec.params.max_tokens, seq.arrival_time)

    def _observe(self, event: StepEvent) -> None:
        """Called by the engine after each step: what each live sample was doing, from the event."""
        scheduled = {(w.request_id, w.index): w.phase for w in event.scheduled}
        states, tables = {}, {}
        for seq in event.sequences:
            key = self._key(seq.request_id, seq.index)
            if seq.status == "running":
                states[key] = scheduled.get((seq.request_id, seq.index), "running")
                tables[key] = list(seq.block_table)
            else:
                states[key] = "preempted" if seq.num_preemptions else "waiting"
        self._record = StepRecord(event, states, tables)

    def _key(self, request_id: str, index: int) -> str:
        return request_id if request_id in self.samples else f"{request_id}.{index}"

    def _step(self) -> None:
        chunks: list[StreamChunk] = self.engine.step()
        record, self._record = self._record, None
        if record is None:
            return
        end = record.event.start + record.event.duration
        with self._lock:
            for chunk in chunks:
                sample = self.samples[self._key(chunk.request_id, chunk.index)]
                sample.text += chunk.text
                sample.token_times.extend([end] * len(chunk.token_ids))
                if chunk.output is not None:
                    sample.finish_reason, sample.metrics = chunk.output.finish_reason, chunk.output.metrics
            self.records.append(record)

    def _release(self) -> None:
        """Abort what is left, so the pool is empty again, and record the pool as it ends. A broken
        part (a learner's) may fail here too: each request is still aborted, and the error kept."""
        self._pending.clear()
        for request_id in {s.request_id for s in self.samples.values() if s.finish_reason is None}:
            try:
                aborted = self.engine.abort(request_id)
            except Exception as exc:
                self._fail(exc)
                continue
            if aborted:
                with self._lock:
                    for sample in self.samples.values():
                        if sample.request_id == request_id and sample.finish_reason is None:
                            sample.finish_reason = "abort"
        try:
            self.final_kv = self.engine.view.kv_stats()
        except Exception as exc:
            self._fail(exc)
