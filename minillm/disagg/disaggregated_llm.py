"""DisaggregatedLLM: prefill and decode in two processes (Splitwise, Patel et al. 2024; DistServe,
Zhong et al. 2024), behind the same generate / stream calls as LLM.

    llm = DisaggregatedLLM("tiny")
    outs = llm.generate(["def fib(n):", "import os"], SamplingParams(max_tokens=32, temperature=0))
    llm.transfers[outs[0].request_id]   # {"kv_bytes", "wire_bytes", "seconds", ...} of its handoff
    llm.shutdown()

Colocated, a long prompt's prefill shares steps with the running decodes, and their inter-token
latency stalls behind it. Here the prefill worker computes prompts only and the decode worker
decodes only, so each can be sized and batched for its own phase; the price is moving every
prompt's KV cache from one to the other: P tokens * layers * 2 * kv_heads * head_dim * dtype bytes.

Transport: torch.distributed send/recv (disagg/handoff.py), not shared memory: it is the call that
moves KV between GPUs and machines (NCCL), so the lab measures the real cost of the wire, where
shared memory would only work within one host. Control travels on pipes (disagg_worker.py).

Failure: a worker that dies, or no news for `timeout` seconds while requests are in flight, raises
RuntimeError / TimeoutError naming it; both workers are then stopped, none is left behind.
"""
import itertools
import multiprocessing as mp
import os
import subprocess
import sys
import time
import weakref
from collections.abc import Iterator
from datetime import timedelta
from multiprocessing.connection import wait

import torch.distributed as dist

from minillm.config import EngineConfig
from minillm.disagg.handoff import DECODE_RANK, PREFILL_RANK
from minillm.disagg.worker_processes import receive, send
from minillm.llm import paired
from minillm.outputs import RequestOutput, StreamChunk
from minillm.sampling import SamplingParams

START_TIMEOUT = 300.0  # seconds for both workers to import torch and load the model
NAMES = {PREFILL_RANK: "prefill", DECODE_RANK: "decode"}


class DisaggregatedLLM:
    def __init__(self, model: str | None = None, check_kv: bool = False, timeout: float = 120.0,
                 threads: int | None = None, **config) -> None:
        """model and config: as LLM's (the flat knobs of config/knobs.py), for both workers (the decode
        worker's pool without prefix caching). check_kv: each handoff's record also holds the K/V
        read back from the decode pool ("kv") and the sha256 of what was sent and of what arrived.
        timeout: seconds without news from the workers, while requests are in flight, before giving up.
        threads: torch threads per worker (None: half this machine's cores each, at least one)."""
        self.config = EngineConfig.from_knobs(model, **config)
        if self.config.speculative is not None or self.config.cache.kind != "paged":
            raise ValueError("DisaggregatedLLM moves paged KV blocks between workers: it needs kv_cache='paged' "
                             "and no speculative decoding")
        self.timeout, self.error = timeout, None
        self.transfers: dict[str, dict] = {}  # request id -> its handoff's record (bytes, seconds, digests)
        self._numbers = itertools.count()
        self._live: set[str] = set()  # requests not finished nor aborted
        self.threads = threads or max(1, (os.cpu_count() or 2) // 2)
        store = dist.TCPStore("127.0.0.1", 0, None, is_master=True, timeout=timedelta(seconds=START_TIMEOUT),
                              wait_for_workers=False)
        self._conns, self._procs = {}, {}
        for rank in NAMES:
            ours, theirs = mp.Pipe()  # a socket pair: the worker gets its end by file descriptor
            self._procs[rank] = subprocess.Popen([sys.executable, "-m", "minillm.disagg.worker_processes",
                                                  str(theirs.fileno())], pass_fds=[theirs.fileno()])
            theirs.close()
            self._conns[rank] = ours
            send(ours, ("start", rank, store.port, config_fields(self.config), self.threads, check_kv))
        self._store = store
        self._finalizer = weakref.finalize(self, _stop, self._procs, self._conns)
        try:
            self._await_ready()
        except BaseException:
            self.shutdown()
            raise

    # -- requests ---------------------------------------------------------------------------
    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None) -> str:
        """Send a request on its way (prefill, then decode); -> its id. Chunks come from poll()."""
        params = params or SamplingParams()
        if params.logprobs is not None:
            raise ValueError("DisaggregatedLLM does not return logprobs (the first token's stay on the prefill "
                             f"worker): use LLM, or logprobs=None (got {params.logprobs})")
        self._check_alive()
        number = next(self._numbers)
        send(self._conns[DECODE_RANK], ("request", number, prompt, params))  # announced before it can arrive
        send(self._conns[PREFILL_RANK], ("request", number, prompt, params))
        self._live.add(str(number))
        return str(number)

    def abort(self, request_id: str) -> None:
        if request_id in self._live and self.error is None:
            self._live.discard(request_id)
            for conn in self._conns.values():
                send(conn, ("abort", int(request_id)))

    def poll(self, timeout: float | None = None) -> list[StreamChunk]:
        """The chunks the workers have sent, waiting up to timeout seconds (None: self.timeout) for
        some. Raises if a worker died, or, with requests in flight, if the wait ran out."""
        self._check_alive()
        ready = wait(list(self._conns.values()), self.timeout if timeout is None else timeout)
        if not ready:
            if timeout is None and self._live:
                self._fail(TimeoutError(f"no news from the workers for {self.timeout} s with {len(self._live)} "
                                        f"requests in flight (timeout={self.timeout})"))
            return []
        chunks = []
        for rank, conn in self._conns.items():
            if conn in ready:
                chunks += self._drain(rank)
        self._live -= {c.request_id for c in chunks if c.request is not None}
        return chunks

    def _drain(self, rank: int) -> list[StreamChunk]:
        """Every message waiting on rank's pipe, handled; the chunks among them. The decode worker's record of a
        handoff first brings in what the prefill worker sent before it: the prefill worker writes its own record
        of that handoff (its K/V digest) before the K/V leave it, so it is in its pipe by then, and the request can
        finish no earlier (else a short request could end with its record half there)."""
        conn, chunks = self._conns[rank], []
        while conn.poll():
            try:
                message = receive(conn)
            except EOFError:  # its end closed: it died
                self._fail(None)
            if message[0] == "handoff" and rank == DECODE_RANK:
                chunks += self._drain(PREFILL_RANK)
            chunks += self._handle(rank, message)
        return chunks

    def generate(self, prompts: str | list[str] | list[list[int]],
                 params: SamplingParams | list[SamplingParams] | None = None) -> list[RequestOutput]:
        """Run every prompt to completion; outputs in the order of the prompts (as LLM.generate)."""
        prompts, params = paired(prompts, params)
        ids = [self.add_request(p, sp) for p, sp in zip(prompts, params)]
        done: dict[str, RequestOutput] = {}
        try:
            while len(done) < len(ids):
                done.update((c.request_id, c.request) for c in self.poll() if c.request is not None)
        except ValueError:
            for rid in ids:
                self.abort(rid)
            raise
        return [done[i] for i in ids]

    def stream(self, prompt: str | list[int], params: SamplingParams | None = None) -> Iterator[StreamChunk]:
        """Yield the request's chunks as the decode worker makes them; stopping early aborts it."""
        rid, finished = self.add_request(prompt, params), False
        try:
            while not finished:
                for chunk in self.poll():
                    if chunk.request_id == rid:
                        finished = chunk.request is not None
                        yield chunk
        finally:
            self.abort(rid)

    # -- lifecycle --------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Stop both workers (killed if they do not exit within seconds). Idempotent."""
        self.error = self.error or "it was shut down"
        self._finalizer()

    def __enter__(self) -> "DisaggregatedLLM":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    @property
    def pids(self) -> dict[str, int]:
        return {NAMES[rank]: p.pid for rank, p in self._procs.items()}

    def _handle(self, rank: int, message: tuple) -> list[StreamChunk]:
        kind = message[0]
        if kind == "chunks":
            return [c for c in message[1] if c.request_id in self._live]
        if kind == "handoff":
            self.transfers.setdefault(str(message[1]), {}).update(message[2])
        elif kind == "rejected":
            self._live.discard(str(message[1]))
            send(self._conns[DECODE_RANK], ("abort", message[1]))
            raise ValueError(message[2])
        elif kind == "crashed":
            self._fail(RuntimeError(f"the {NAMES[rank]} worker failed:\n{message[1]}"))
        return []

    def _await_ready(self) -> None:
        waiting, deadline = set(NAMES), time.monotonic() + START_TIMEOUT
        while waiting:
            left = deadline - time.monotonic()
            ready = wait([self._conns[r] for r in waiting], left)
            if not ready:
                raise TimeoutError(f"the workers did not start within {START_TIMEOUT:.0f} s")
            for rank in list(waiting):
                conn = self._conns[rank]
                if conn in ready:
                    try:
                        message = receive(conn)
                    except EOFError:
                        self._fail(None)
                    if message[0] != "ready":
                        self._handle(rank, message)
                    waiting.discard(rank)

    def _check_alive(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"this DisaggregatedLLM is stopped ({self.error}): create a new one")

    def _fail(self, error: BaseException | None) -> None:
        """Stop both workers and raise `error`, or a RuntimeError saying which worker died and how."""
        if error is None:
            time.sleep(0.5)  # the pipe closes a moment before the process is reaped
            dead = [f"the {NAMES[rank]} worker (pid {p.pid}) {_how(p.poll())}" for rank, p in self._procs.items()
                    if p.poll() is not None]
            who = " and ".join(dead) or "a worker closed its pipe"
            error = RuntimeError(f"{who} with {len(self._live)} requests in flight: the other worker was stopped; "
                                 f"create a new DisaggregatedLLM")
        self.error = str(error).splitlines()[0]
        for proc in self._procs.values():
            proc.kill()  # mid-run, a survivor's peer is gone: nothing is left to finish cleanly
        self._finalizer()
        raise error


def config_fields(config: EngineConfig) -> dict:
    """The EngineConfig as keyword arguments, to rebuild it in a worker process."""
    return {name: getattr(config, name) for name in config.__dataclass_fields__}


def _how(exitcode: int) -> str:
    return f"was killed by signal {-exitcode}" if exitcode < 0 else f"exited with code {exitcode}"


def _stop(procs: dict, conns: dict) -> None:
    """Ask the workers to stop (prefill first: it sends the decode worker STOP), then make sure."""
    for rank in (PREFILL_RANK, DECODE_RANK):
        if procs[rank].poll() is None:
            try:
                send(conns[rank], ("stop",))
            except (BrokenPipeError, OSError):
                pass  # it is exiting already
    for proc in procs.values():
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for conn in conns.values():
        conn.close()
