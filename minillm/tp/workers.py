"""The tensor-parallel process group: rank 0 is the engine's own process (the driver), ranks 1..N-1
are worker processes started here, each holding its shard of the weights and of the KV cache.

Rendezvous as torchrun does it: the driver opens a TCPStore on a free loopback port and starts
each worker as a Python process running main() below, with MASTER_ADDR=127.0.0.1, MASTER_PORT, RANK
and WORLD_SIZE in its environment; every rank then joins the store and calls init_process_group("gloo").

What rank 0 broadcasts (torch.distributed.broadcast_object_list), one message at a time:

    {"kind": "pool", "num_blocks", "block_size"}   build this rank's KV pool (its kv heads only)
    {"kind": "step", "input_ids", "positions",     one forward: the step's tokens, the changes the
     "pool_ops", "context"}                        scheduler made to rank 0's pool since the last
                                                   step, and the paged context's slot mapping,
                                                   block tables and sequence lengths (None: no cache)
    {"kind": "stop"}                               exit

Two groups, two timeouts: workers wait for the next message on the default group, whose timeout
is long because an idle engine sends nothing for as long as it is idle; the all-reduces inside a
forward use their own group with a short timeout, since every rank is in the same step then and a
silent peer is a broken one. A dead peer needs neither: gloo reports a closed connection at once.
A worker also exits when its parent process is gone (the watchdog below), whatever it is doing.
"""
import os
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from minillm.cache.paged import PagedContext
from minillm.cache.pool import PagedKVPool
from minillm.config import DTYPES
from minillm.models.prepare import load_model
from minillm.tp.comm import AllReduceMeter
from minillm.tp.tp_model import shard_model

IDLE_TIMEOUT = timedelta(days=30)     # waiting for the next message: the engine may idle that long
STEP_TIMEOUT = timedelta(seconds=60)  # an all-reduce inside a forward
START_TIMEOUT = 300.0                 # seconds for the workers to start (each imports torch)
# `-c`, not `-m`: `-m` would run this module twice (minillm imports it)
WORKER = "from minillm.tp.workers import main; main()"


class WorkerGroup:
    """The driver's handle on ranks 1..world-1: start them, broadcast to them, stop them."""

    def __init__(self, world: int, model_dir: str, dtype: torch.dtype) -> None:
        if dist.is_initialized():
            raise RuntimeError("this process already runs a tensor-parallel group (torch.distributed has one "
                               "default group per process): shut the other LLM down first (llm.model.shutdown())")
        self.world, self.error = world, None
        store = dist.TCPStore("127.0.0.1", 0, world, is_master=True, timeout=timedelta(seconds=START_TIMEOUT),
                              wait_for_workers=False)
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(store.port),
               "WORLD_SIZE": str(world), "MINILLM_TP_MODEL": str(model_dir),
               "MINILLM_TP_DTYPE": str(dtype).removeprefix("torch.")}
        self.procs = [subprocess.Popen([sys.executable, "-c", WORKER], env={**env, "RANK": str(r)})
                      for r in range(1, world)]
        try:
            self._wait_for_workers(store)
            dist.init_process_group("gloo", store=store, rank=0, world_size=world, timeout=IDLE_TIMEOUT)
            self.step_group = dist.new_group(backend="gloo", timeout=STEP_TIMEOUT)
        except BaseException:
            self.stop()
            raise

    def _wait_for_workers(self, store: dist.TCPStore) -> None:
        """Until every worker has imported torch and checked in; a worker that exits first fails fast."""
        deadline = time.monotonic() + START_TIMEOUT
        while not store.check([f"up/{r}" for r in range(1, self.world)]):
            self.raise_if_dead("while starting")
            if time.monotonic() > deadline:
                raise RuntimeError(f"tensor-parallel workers did not start within {START_TIMEOUT:.0f} s")
            time.sleep(0.05)

    def send(self, message: dict) -> None:
        """Broadcast one message from rank 0 to every worker."""
        if self.error is not None:
            raise RuntimeError(f"the tensor-parallel group is stopped ({self.error}): create a new LLM")
        self.raise_if_dead("before a step")
        dist.broadcast_object_list([message], src=0)

    def raise_if_dead(self, when: str, grace: float = 0.0) -> None:
        """Raise a clear error (and stop the rest) if a worker has exited; wait up to `grace` seconds
        for one to (a closed connection can be seen a moment before the process is reaped)."""
        if self.error is not None:
            return  # stopped already, and its error said why
        deadline = time.monotonic() + grace
        while True:
            dead = [(r, p) for r, p in enumerate(self.procs, 1) if p.poll() is not None]
            if dead or time.monotonic() >= deadline:
                break
            time.sleep(0.02)
        if dead:
            rank, proc = dead[0]
            code = proc.returncode
            how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
            self.stop(f"worker rank {rank} (pid {proc.pid}) {how} {when}")
            raise RuntimeError(f"tensor-parallel worker rank {rank} (pid {proc.pid}) {how} {when}: its shard of the "
                               f"weights and KV cache is gone, so the engine cannot continue. The other workers "
                               f"were stopped; create a new LLM")

    def stop(self, failure: str | None = None) -> None:
        """Leave the group and make sure no worker outlives it: after a clean run they are told to
        exit (and killed if they hang); after a failure (`failure` says what) the survivors are
        killed at once, since the group is broken mid-step. Idempotent."""
        alive = all(p.poll() is None for p in self.procs)
        if failure is None and self.error is None and dist.is_initialized() and alive:
            try:
                dist.broadcast_object_list([{"kind": "stop"}], src=0)
            except RuntimeError:
                failure = "a worker left during shutdown"
        else:
            for proc in self.procs:
                proc.kill()  # no-op for one already gone
        self.error = self.error or failure or "shut down"
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if dist.is_initialized():
            dist.destroy_process_group()


def _exit_with_parent(parent: int) -> None:
    """The watchdog: a worker whose driver died (killed, crashed) exits rather than wait forever."""
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(1)


@torch.inference_mode()
def serve(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """A worker's loop: apply rank 0's messages to this rank's shard until told to stop."""
    pool = None
    while True:
        box = [None]
        dist.broadcast_object_list(box, src=0)
        message = box[0]
        if message["kind"] == "stop":
            return
        if message["kind"] == "pool":
            pool = PagedKVPool(model.config, message["num_blocks"], message["block_size"], dtype, torch.device("cpu"))
            continue
        for name, args in message["pool_ops"]:
            getattr(pool, name)(*args)
        ctx = None if message["context"] is None else PagedContext(pool, *message["context"])
        model(message["input_ids"], message["positions"], ctx)  # its all-reduces pair with the other ranks'


def main() -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()
    torch.set_num_threads(max(1, torch.get_num_threads() // world))  # the ranks share the machine's cores
    dtype = DTYPES[os.environ["MINILLM_TP_DTYPE"]]
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
    store.set(f"up/{rank}", "1")
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=IDLE_TIMEOUT)
    all_reduce = AllReduceMeter(dist.new_group(backend="gloo", timeout=STEP_TIMEOUT))
    full = load_model(Path(os.environ["MINILLM_TP_MODEL"]), dtype, torch.device("cpu"))
    model = shard_model(full, rank, world, all_reduce)
    del full  # the shard keeps only what it needs (its slices, and the replicated embedding, norms and head)
    try:
        serve(model, dtype)
    except RuntimeError as e:  # the driver went away mid-message: nothing left to serve
        print(f"minillm tensor-parallel worker rank {rank}: {e}", file=sys.stderr)
        sys.exit(1)
    dist.destroy_process_group()
