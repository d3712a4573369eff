"""Running the app: in a background thread (tests, benchmarks, the Streamlit app) or as the
command-line server.

    with serve_in_thread("tiny") as server:          # a free loopback port
        openai.OpenAI(base_url=server.base_url + "/v1", api_key="-").completions.create(...)

`run_server` is `python -m minillm serve`: on SIGINT or SIGTERM uvicorn stops accepting
connections and lets the in-flight requests finish for `grace_period` seconds. Just before it
would cancel the rest, the app's `end_streams()` ends them itself: each open stream gets an error
event and `[DONE]` (a cancelled one would be cut without a word), a waiting request a 503, and
their engine requests are aborted (their KV blocks freed). Then the process exits 0.
"""
import asyncio
import signal
import socket
import threading
from dataclasses import dataclass

import uvicorn
from fastapi import FastAPI

from minillm.async_llm import AsyncLLM
from minillm.llm import LLM
from minillm.serve.app import build_app
from minillm.serve.connection_limits import ConnectionGuard, ConnectionLimits
from minillm.structured.grammar import GrammarLimits

END_STREAMS_MARGIN_S = 0.5  # end the open streams this long before uvicorn would cancel them
DRAIN_POLL_S = 0.05  # how often a shutdown tells the connections to close


class DrainingServer(uvicorn.Server):
    """uvicorn's server, which calls the app's `state.end_streams()` (if it has one) just before the
    graceful shutdown's timeout, so that what is still open ends cleanly instead of being cancelled.

    It also closes the connections that uvicorn's shutdown misses. uvicorn tells the connections open
    when the shutdown starts to close once idle; one the kernel had accepted while the event loop was
    busy becomes a connection a moment later, is served, and then stays open: the drain waits for it
    until the grace period ends, and its socket outlives the loop, so a client that sends on it (a
    router's keep-alive health check) waits for its own timeout instead of seeing the server gone.
    So during the drain every connection is told again every DRAIN_POLL_S, and any left at the end is
    closed."""

    async def shutdown(self, sockets=None) -> None:
        end = getattr(self.config.app.state, "end_streams", None) if hasattr(self.config.app, "state") else None
        grace = self.config.timeout_graceful_shutdown
        loop = asyncio.get_running_loop()
        timer = None
        if end is not None and grace is not None:
            delay = max(0.0, grace - min(END_STREAMS_MARGIN_S, grace / 4))
            timer = loop.call_later(delay, end)
        latecomers = loop.create_task(self._close_when_idle())
        try:
            await super().shutdown(sockets)
        finally:
            latecomers.cancel()
            if timer is not None:
                timer.cancel()
            for connection in list(self.server_state.connections):
                connection.transport.close()

    async def _close_when_idle(self) -> None:
        """Ask every connection to close once its response is sent (an idle one closes now), again and again."""
        while True:
            for connection in list(self.server_state.connections):
                connection.shutdown()
            await asyncio.sleep(DRAIN_POLL_S)


def _as_async_llm(llm_or_model) -> AsyncLLM:
    if isinstance(llm_or_model, AsyncLLM):
        return llm_or_model
    if isinstance(llm_or_model, LLM):
        return AsyncLLM.from_engine(llm_or_model.engine)
    return AsyncLLM(llm_or_model)


def bind_socket(host: str, port: int) -> socket.socket:
    """Bind before uvicorn starts, so port 0 (any free port) is known at once."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


@dataclass
class ThreadedApp:
    """An ASGI app served by uvicorn in a thread of this process; `stop()` (or leaving the `with`) shuts it down."""
    base_url: str
    app: FastAPI
    server: uvicorn.Server
    thread: threading.Thread

    def stop(self, timeout: float = 15.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


@dataclass
class ServerHandle(ThreadedApp):
    """The OpenAI-compatible server in a thread of this process, and the engine behind it."""
    llm: AsyncLLM | None = None


def uvicorn_config(app: FastAPI, limits: ConnectionLimits, **options) -> uvicorn.Config:
    """uvicorn's settings for app, with the connection limits enforced (serve/connection_limits.py)."""
    return uvicorn.Config(ConnectionGuard(app, limits), lifespan="on", **limits.uvicorn_options(),
                          **options)


def app_in_thread(app: FastAPI, host: str = "127.0.0.1", port: int = 0, name: str = "minillm-app",
                  grace: float = 3.0, connection_limits: ConnectionLimits | None = None) -> ThreadedApp:
    """Serve app (the server, the router, a test's fake replica) in a daemon thread on its own event loop;
    return once it listens (port 0: a free one). On stop, open streams get `grace` seconds, then are cancelled."""
    sock = bind_socket(host, port)
    config = uvicorn_config(app, connection_limits or ConnectionLimits(), log_level="warning",
                            timeout_graceful_shutdown=grace)
    server = DrainingServer(config)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True, name=name)
    thread.start()
    while not server.started:  # uvicorn sets it once the socket is listening
        if not thread.is_alive():
            raise RuntimeError(f"the {name} thread exited before it started: see its log above")
        threading.Event().wait(0.01)
    bound_host, bound_port = sock.getsockname()[:2]
    display = f"[{bound_host}]" if ":" in bound_host else bound_host
    return ThreadedApp(f"http://{display}:{bound_port}", app, server, thread)


def serve_in_thread(llm_or_model="tiny", host: str = "127.0.0.1", port: int = 0,
                    connection_limits: ConnectionLimits | None = None, grammar_limits: GrammarLimits | None = None,
                    **app_options) -> ServerHandle:
    """Start the server on its own event loop in a daemon thread; return once it accepts connections.
    llm_or_model: an AsyncLLM, an LLM (its engine is driven from now on), or a model name/folder.
    app_options: build_app's (model_name, api_key, max_waiting, admission, max_body_bytes, limits: what one request
    may ask for); model_name defaults to the model's name. stop() gives open streams 5 s, then cancels them (their
    requests are aborted). connection_limits, grammar_limits: what a connection and a grammar may cost (None: the
    defaults, docs/serving.md)."""
    llm = _as_async_llm(llm_or_model)
    llm.engine.input_processor.grammar_limits = grammar_limits or GrammarLimits()
    app_options.setdefault("model_name", llm.config.model)
    running = app_in_thread(build_app(llm, **app_options), host, port, name="minillm-server", grace=5.0,
                            connection_limits=connection_limits)
    return ServerHandle(running.base_url, running.app, running.server, running.thread, llm)


def run_server(model: str | None = None, host: str = "127.0.0.1", port: int = 8000, grace_period: float = 10.0,
               engine_options: dict | None = None, connection_limits: ConnectionLimits | None = None,
               grammar_limits: GrammarLimits | None = None, **app_options) -> int:
    """Serve until SIGINT/SIGTERM, drain for grace_period seconds, abort the rest; -> exit code 0."""
    llm = AsyncLLM(model, **(engine_options or {}))
    llm.engine.input_processor.grammar_limits = grammar_limits or GrammarLimits()
    app_options.setdefault("model_name", llm.config.model)
    app = build_app(llm, **app_options)
    config = uvicorn_config(app, connection_limits or ConnectionLimits(), host=host, port=port, log_level="info",
                            timeout_graceful_shutdown=grace_period)
    # uvicorn re-raises the signal it caught once it has shut down (so a default handler would kill
    # the process with it); handlers that do nothing make the drained shutdown an ordinary exit 0
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: None)
    DrainingServer(config).run()
    return 0
