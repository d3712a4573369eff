"""The two worker processes of disaggregated serving: each runs its own LLMEngine.

    prefill (rank 0)  computes each prompt and samples its first tokens, then hands the request
                      off: its prompt's K/V (pack_kv), first tokens and generator states go to the
                      decode worker (handoff.py), and its blocks come back to its own pool.
    decode  (rank 1)  admits each handoff into fresh blocks of its pool (unpack_kv), the prompt
                      counted as computed, and decodes it to the end, streaming chunks to the facade.

Control (requests, aborts, chunks, errors) travels on a pipe to the facade (disagg/disaggregated_llm.py); only
the handoffs use torch.distributed. Messages from the facade: ("request", number, prompt, params),
("abort", number), ("stop",). To it: ("ready",), ("chunks", [StreamChunk]), ("handoff", number,
record), ("rejected", number, message), ("crashed", traceback). A worker exits when the facade's
end of the pipe closes, so none outlives its facade. Each is started as `python -m
minillm.disagg.worker_processes FD` (not multiprocessing's spawn, which re-runs the caller's script).
"""
import os
import pickle
import sys
import traceback
from collections import deque
from dataclasses import replace
from datetime import timedelta
from multiprocessing.connection import Connection

import torch
import torch.distributed as dist

from minillm.config import EngineConfig
from minillm.disagg.handoff import PREFILL_RANK, HandoffReceiver, HandoffSender, digest
from minillm.disagg.kv_transfer import pack_kv, unpack_kv
from minillm.engine.engine import LLMEngine

IDLE_TIMEOUT = timedelta(days=30)  # a handoff may be waited for as long as no prompt arrives
IDLE_POLL = 0.002  # seconds an idle decode loop waits on the wire before looking at the pipe again


def send(conn: Connection, message: tuple) -> None:
    """Pickle with the standard pickler: multiprocessing's would pass tensors by shared memory,
    through a resource sharer that a process started outside multiprocessing cannot reach."""
    conn.send_bytes(pickle.dumps(message))


def receive(conn: Connection) -> tuple:
    return pickle.loads(conn.recv_bytes())


def run_worker(conn: Connection) -> None:
    """A worker process's life: take its settings from the facade, join the group of two, load the
    engine, then serve until stopped. The facade's first message: ("start", rank, store port,
    EngineConfig fields, torch threads, check_kv)."""
    try:
        _, rank, store_port, config, threads, check_kv = receive(conn)
        torch.set_num_threads(threads)
        store = dist.TCPStore("127.0.0.1", store_port, 2, is_master=False, timeout=timedelta(seconds=120))
        dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=IDLE_TIMEOUT)
        if rank == PREFILL_RANK:
            serve_prefill(LLMEngine(EngineConfig(**config)), conn, check_kv)
        else:  # the decode pool holds running sequences' own blocks: prompts are matched on the prefill side
            cache = replace(config["cache"], enable_prefix_caching=False)
            serve_decode(LLMEngine(EngineConfig(**{**config, "cache": cache})), conn, check_kv)
    except (EOFError, BrokenPipeError):
        os._exit(1)  # the facade is gone: leave at once (a thread may still wait on the wire)
    except BaseException:
        send(conn, ("crashed", traceback.format_exc()))
        os._exit(1)
    os._exit(0)  # a clean stop; the handoff threads are done, or daemons waiting on a closed wire


def serve_prefill(engine: LLMEngine, conn: Connection, check_kv: bool) -> None:
    sender = HandoffSender()
    send(conn, ("ready",))
    while True:
        if not engine.has_unfinished():
            conn.poll(None)  # idle: sleep until the facade writes (EOF raises in recv)
        while conn.poll():
            message = receive(conn)
            if message[0] == "stop":
                sender.close(timeout=10)
                return
            if message[0] == "abort":
                engine.abort(str(message[1]))
            else:
                _, number, prompt, params = message
                try:
                    engine.add_request(prompt, params, str(number))
                except (ValueError, TypeError) as e:
                    send(conn, ("rejected", number, str(e)))
        first = {}  # request id -> its chunks: every sample's first token
        for chunk in engine.step():
            first.setdefault(chunk.request_id, []).append(chunk)
        for rid, chunks in first.items():
            if any(c.request is not None for c in chunks):  # every sample stopped at its first token
                send(conn, ("chunks", chunks))
                continue
            prefilled = engine.handoff.give(rid, pack_kv)
            # this record first: the facade reads it when the decode worker reports the K/V's arrival (disagg.py)
            send(conn, ("handoff", int(rid), {"sent_sha256": digest(prefilled.kv)} if check_kv else {}))
            sender.put(int(rid), prefilled)


def serve_decode(engine: LLMEngine, conn: Connection, check_kv: bool) -> None:
    receiver = HandoffReceiver()
    requests: dict[int, tuple] = {}  # number -> (prompt, params): announced by the facade, not yet imported
    pending: deque = deque()  # handoffs received, waiting for room in the pool
    send(conn, ("ready",))
    while True:
        arrived = receiver.get(timeout=0 if engine.has_unfinished() or pending else IDLE_POLL)
        while conn.poll():  # after the wire: a request is announced here before its prompt reaches prefill
            message = receive(conn)
            if message[0] == "stop":
                receiver.join(timeout=5)
                return
            if message[0] == "abort":
                number = message[1]
                requests.pop(number, None)
                engine.abort(str(number))
            else:
                requests[message[1]] = message[2:]
        pending.extend(arrived)
        while pending:
            number, prefilled, record = pending[0]
            if number not in requests:  # aborted while on the wire
                pending.popleft()
                continue
            prompt, params = requests[number]
            unpack = _checked(unpack_kv, record) if check_kv else unpack_kv
            chunks = engine.handoff.take(prefilled, params, str(number), unpack,
                                          prompt=prompt if isinstance(prompt, str) else None)
            if chunks is None:
                break  # no room yet: it waits for running sequences to finish
            pending.popleft()
            del requests[number]
            send(conn, ("handoff", number, record))
            send(conn, ("chunks", chunks))
        if engine.has_unfinished():
            chunks = engine.step()
            if chunks:
                send(conn, ("chunks", chunks))


def _checked(unpack, record: dict):
    """unpack, then read the blocks back from the pool into record["kv"], with their sha256."""
    def unpack_and_read(kv, pool, blocks):
        unpack(kv, pool, blocks)
        record["kv"] = pack_kv(pool, blocks, kv.shape[2])
        record["received_sha256"] = digest(record["kv"])
    return unpack_and_read


if __name__ == "__main__":  # python -m minillm.disagg.worker_processes FD: FD is this end of the facade's pipe
    run_worker(Connection(int(sys.argv[1])))
