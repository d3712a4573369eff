"""The handoff: a prefilled prompt on the wire, from the prefill worker (rank 0) to the decode worker (rank 1).

Transport: torch.distributed point-to-point (gloo here; the same send/recv calls run on NCCL
between GPUs, and across machines). A message is a fixed-size header, then the tensors it describes:

    header  int64 [9]    kind (PREFILLED | STOP), request number, P (prompt tokens), n (samples),
                         generator state bytes, layers, kv_heads, head_dim, dtype (index in DTYPES)
    tokens  int64 [P+n]  the prompt, then each sample's first token
    times   float64 [2]  arrival, first scheduled (time.perf_counter, one clock per host; NaN: none)
    states  uint8 [n, s] each sample's generator state (a row of zeros: the sample stopped at its first token)
    kv      dtype [2, layers, P, kv_heads, head_dim]   the prompt's K/V (kv_transfer.pack_kv)

A blocking recv gives no way to poll on gloo (a posted irecv completes only when waited on), so each
side moves messages in a thread of its own: the engine's loop never waits on the wire, and the
thread waits with the GIL released. A peer that dies closes the connection: gloo raises at once.
"""
import hashlib
import math
import queue
import threading
import time

import torch
import torch.distributed as dist

from minillm.sequence import PrefilledPrompt

PREFILLED, STOP = 1, 0
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
PREFILL_RANK, DECODE_RANK = 0, 1


def send_handoff(number: int, prompt: PrefilledPrompt) -> None:
    """Send one prefilled prompt to the decode rank (blocking until the receiver has it all)."""
    kv, n = prompt.kv, len(prompt.first_tokens)
    live = [s for s in prompt.generator_states if s is not None]
    width = live[0].numel() if live else 0
    states = torch.zeros(n, width, dtype=torch.uint8)
    for i, state in enumerate(prompt.generator_states):
        if state is not None:
            states[i] = state
    first_scheduled = math.nan if prompt.first_scheduled_time is None else prompt.first_scheduled_time
    header = torch.tensor([PREFILLED, number, len(prompt.prompt_ids), n, width, *kv.shape[1:2], *kv.shape[3:],
                           DTYPES.index(kv.dtype)])
    for tensor in (header, torch.tensor(prompt.prompt_ids + prompt.first_tokens),
                   torch.tensor([prompt.arrival_time, first_scheduled], dtype=torch.float64), states, kv.cpu()):
        dist.send(tensor.contiguous(), DECODE_RANK)


def send_stop() -> None:
    dist.send(torch.tensor([STOP] + [0] * 8), DECODE_RANK)


def recv_handoff() -> tuple[int, PrefilledPrompt, dict] | None:
    """Receive the next message from the prefill rank. -> (request number, the prefilled prompt,
    {kv_bytes, wire_bytes, seconds}), or None for STOP."""
    header = torch.empty(9, dtype=torch.int64)
    dist.recv(header, PREFILL_RANK)
    kind, number, p, n, width, layers, kv_heads, head_dim, dtype = header.tolist()
    if kind == STOP:
        return None
    start = time.perf_counter()
    tokens, times = torch.empty(p + n, dtype=torch.int64), torch.empty(2, dtype=torch.float64)
    states = torch.empty(n, width, dtype=torch.uint8)
    kv = torch.empty(2, layers, p, kv_heads, head_dim, dtype=DTYPES[dtype])
    for tensor in (tokens, times, states, kv):
        dist.recv(tensor, PREFILL_RANK)
    ids, (arrival, scheduled) = tokens.tolist(), times.tolist()
    # each state its own tensor: Generator.set_state on a row view (a storage offset) crashes torch 2.13
    prompt = PrefilledPrompt(ids[:p], ids[p:], kv, [s.clone() if s.any() else None for s in states], arrival,
                             None if math.isnan(scheduled) else scheduled)
    moved = [header, tokens, times, states, kv]
    record = {"kv_bytes": kv.numel() * kv.element_size(), "seconds": time.perf_counter() - start,
              "wire_bytes": sum(t.numel() * t.element_size() for t in moved)}
    return number, prompt, record


def digest(tensor: torch.Tensor) -> str:
    """sha256 of a tensor's bytes: equal digests mean bit-identical values."""
    return hashlib.sha256(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes()).hexdigest()


class HandoffSender:
    """The prefill side: put() queues a handoff and returns; a thread sends them in order."""

    def __init__(self) -> None:
        self._queue: queue.Queue = queue.Queue()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="handoff-sender", daemon=True)
        self._thread.start()

    def put(self, number: int, prompt: PrefilledPrompt) -> None:
        if self.error is not None:
            raise RuntimeError(f"lost the decode worker: {self.error}")
        self._queue.put((number, prompt))

    def close(self, timeout: float) -> bool:
        """Send what is queued, then STOP. -> whether the thread finished within timeout seconds."""
        self._queue.put(None)
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        try:
            while (item := self._queue.get()) is not None:
                send_handoff(*item)
            send_stop()
        except BaseException as e:  # the decode worker is gone: the prefill loop reports it
            self.error = e


class HandoffReceiver:
    """The decode side: a thread receives handoffs; get() returns those arrived so far, without waiting."""

    def __init__(self) -> None:
        self._queue: queue.Queue = queue.Queue()
        self.error: BaseException | None = None
        self.stopped = False  # the prefill worker sent STOP
        self._thread = threading.Thread(target=self._run, name="handoff-receiver", daemon=True)
        self._thread.start()

    def get(self, timeout: float = 0.0) -> list[tuple[int, PrefilledPrompt, dict]]:
        """The handoffs received since the last call, waiting up to timeout seconds for a first one."""
        if self.error is not None:
            raise RuntimeError(f"lost the prefill worker: {self.error}")
        got = []
        try:
            got.append(self._queue.get(timeout=timeout) if timeout > 0 else self._queue.get_nowait())
            while True:
                got.append(self._queue.get_nowait())
        except queue.Empty:
            return got

    def join(self, timeout: float) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        try:
            while (item := recv_handoff()) is not None:
                self._queue.put(item)
            self.stopped = True
        except BaseException as e:  # the prefill worker is gone: the decode loop reports it
            self.error = e
