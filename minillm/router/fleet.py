"""A fleet on one machine: N replica servers as subprocesses and the router in a thread of this process.

    with Fleet.start(replicas=2, policy="prefix_aware") as fleet:
        openai.OpenAI(base_url=fleet.base_url + "/v1", api_key="-").completions.create(...)
        fleet.kill(0)                  # a replica dies: the router takes it out of rotation

Each replica is `python -m minillm serve --port P` on a free loopback port; `stop()` sends SIGTERM
(the server drains and exits 0), then SIGKILL to any replica still there after a few seconds, so no
process outlives the fleet. `route_in_thread` alone puts a router in front of servers already running;
`app_in_thread` serves any ASGI app (the router, a test's fake replica) in a thread.
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

import httpx

from minillm.router.proxy import build_router
from minillm.router.replica_state import RouterState
from minillm.serve.server import ThreadedApp, app_in_thread, bind_socket


def route_in_thread(urls: list[str], host: str = "127.0.0.1", port: int = 0, **router_options) -> ThreadedApp:
    """build_router(urls, **router_options) in a thread; its RouterState is `.app.state.router.state`."""
    return app_in_thread(build_router(urls, **router_options), host, port, name="minillm-router")


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now (the OS picks it); a replica binds it a moment later."""
    with bind_socket(host, 0) as sock:
        return sock.getsockname()[1]


@dataclass
class Fleet:
    processes: list[subprocess.Popen]
    urls: list[str]
    router: ThreadedApp | None = None
    logs: list[str] = field(default_factory=list)  # each replica's log file
    log_folder: str | None = None  # the logs' folder when the fleet made it (stop() removes it)

    @classmethod
    def start(cls, replicas: int = 2, model: str | None = None, policy: str = "prefix_aware", port: int = 0,
              replica_args: tuple[str, ...] = (), startup_timeout: float = 180.0, log_dir: str | None = None,
              **router_options) -> "Fleet":
        """Launch the replicas, wait until each answers /health, then start the router on `port`.
        replica_args: more `serve` options for every replica (say "--max-num-seqs", "8")."""
        if replicas < 1:
            raise ValueError(f"a fleet needs at least 1 replica, got {replicas}")
        ports = [free_port() for _ in range(replicas)]
        owned_logs = log_dir is None  # a folder of its own, removed by stop() (errors quote the logs' tails)
        log_dir = log_dir or tempfile.mkdtemp(prefix="minillm-fleet-")
        # replicas on one machine share its cores: each gets its share of threads, not all of them
        env = {"OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // replicas)), **os.environ}
        fleet = cls([], [f"http://127.0.0.1:{p}" for p in ports], log_folder=log_dir if owned_logs else None)
        try:
            for p in ports:
                fleet.logs.append(os.path.join(log_dir, f"minillm-replica-{p}.log"))
                with open(fleet.logs[-1], "w") as log:
                    command = [sys.executable, "-m", "minillm", "serve", "--port", str(p),
                               *(["--model", model] if model else []), *replica_args]
                    fleet.processes.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                                            stdin=subprocess.DEVNULL, env=env))
            fleet.wait_healthy(startup_timeout)
            fleet.router = route_in_thread(fleet.urls, port=port, policy=policy, model=model or "tiny",
                                           **router_options)
        except BaseException:
            fleet.stop()
            raise
        return fleet

    @property
    def base_url(self) -> str:
        return self.router.base_url

    @property
    def state(self) -> RouterState:
        """The router's view of the replicas: per replica alive, in_flight, routed, failures, index."""
        return self.router.app.state.router.state

    def wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for url, process, log in zip(self.urls, self.processes, self.logs):
            while True:
                if process.poll() is not None:
                    raise RuntimeError(f"the replica at {url} exited with {process.returncode} while starting; "
                                       f"its log ({log}) ends: {_tail(log)}")
                try:
                    if httpx.get(url + "/health", timeout=2.0).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the replica at {url} did not answer /health within {timeout} s; "
                                       f"its log ({log}) ends: {_tail(log)}")
                time.sleep(0.2)

    def kill(self, i: int) -> None:
        """SIGKILL replica i: it dies at once, mid-request, as a crashed machine does."""
        self.processes[i].kill()
        self.processes[i].wait(10)

    def stop(self, grace: float = 8.0) -> None:
        """The router first (no new requests), then SIGTERM every replica, SIGKILL what remains."""
        if self.router is not None:
            self.router.stop()
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for process in self.processes:
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
        if self.log_folder is not None:
            shutil.rmtree(self.log_folder, ignore_errors=True)

    def __enter__(self) -> "Fleet":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _tail(path: str, chars: int = 800) -> str:
    with open(path, errors="replace") as f:
        return f.read()[-chars:]
