"""A cache-aware HTTP router in front of N OpenAI-compatible replicas (minillm, vLLM, SGLang).

    POST /v1/completions, /v1/chat/completions   routed, then passed through (streams event by event)
    GET  /v1/models                              the first live replica's answer
    GET  /health                                 200 with the replicas' state while one is alive, else 503
    GET  /metrics                                per replica: routed, failures, in flight, prefix hit estimate

Each request's prompt is tokenized with the model's tokenizer (a chat rendered with its template
first, as the replica will), and a routing policy (router/policies.py, shared with the simulator)
picks a replica from its load and the prompt tokens its PrefixIndex expects cached.

Failures: a replica that refuses or drops a connection is taken out of rotation at once; a
background health check (GET /health every `health_interval` seconds) takes out one that stops
answering and brings back one that answers again. A request that failed before any byte reached
the client is sent once more, to another replica; one that fails mid-stream ends with an error
event and [DONE]; with no live replica the answer is 503 in OpenAI's error shape. Every wait has a
timeout, so nothing hangs.
"""
import asyncio
import json
from contextlib import asynccontextmanager
from dataclasses import dataclass

import anyio
import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from minillm.chat_template import ChatTemplate
from minillm.models.registry import resolve_model_path
from minillm.router.replica_metrics import metrics_registry
from minillm.router.replica_state import NoReplicaAlive, Replica, RouterState
from minillm.serve.errors import APIError, error_body, install_error_handlers
from minillm.serve.responses import sse
from minillm.tokenizer import Tokenizer

PASSED_HEADERS = ("authorization", "content-type")       # request headers the replica needs
RETURNED_HEADERS = ("content-type", "cache-control", "retry-after")
EVENT_END = b"\n\n"  # the replicas end each SSE event with a blank line (serve/responses.sse)


@dataclass(frozen=True)
class Timeouts:
    """Seconds. read: the longest silence from a replica (a non-streamed answer is one long read)."""
    connect: float = 3.0
    read: float = 120.0
    health: float = 5.0


class Router:
    def __init__(self, state: RouterState, model: str = "tiny", timeouts: Timeouts = Timeouts(),
                 health_interval: float = 1.0) -> None:
        model_dir = resolve_model_path(model)
        self.state, self.timeouts, self.health_interval = state, timeouts, health_interval
        self.tokenizer, self.template = Tokenizer(model_dir), ChatTemplate.for_model(model_dir)
        self.client: httpx.AsyncClient | None = None

    def prompt_ids(self, path: str, content: bytes) -> list[int]:
        """The token ids the replica's prefix cache will be asked for (a batch of prompts is routed
        by its first). A body the router cannot read gives []: the replica will say what is wrong."""
        try:
            body = json.loads(content)
            if path == "/v1/chat/completions":
                return self.tokenizer.encode(self.template.render(body["messages"]))
            prompt = body["prompt"]
            if isinstance(prompt, list) and not isinstance(prompt[0], int):
                prompt = prompt[0]
            return prompt if isinstance(prompt, list) else self.tokenizer.encode(prompt)
        except (ValueError, KeyError, TypeError, IndexError, AttributeError):
            return []

    async def forward(self, method: str, path: str, content: bytes, headers: dict[str, str]) -> Response:
        """Send to the policy's replica; on a failure before any byte came back, once more elsewhere."""
        prompt, tried, errors = self.prompt_ids(path, content), set(), []
        for _ in range(2):
            try:
                replica = self.state.pick(prompt, exclude=tried)
            except NoReplicaAlive as e:
                raise APIError(503, f"no replica is alive to serve {path}: {e}" + "".join(errors),
                               code="no_replica_available") from None
            tried.add(replica)
            upstream = None
            try:
                upstream = await self.client.send(self.client.build_request(
                    method, replica.url + path, content=content, headers=headers), stream=True)
                if not upstream.headers.get("content-type", "").startswith("text/event-stream"):
                    body = await upstream.aread()
                    self.state.release(replica, failed=upstream.status_code >= 500)
                    return Response(body, upstream.status_code, _returned(upstream.headers))
                events = _events(upstream)
                first = await anext(events)  # the retry is possible until this is passed on
            except (httpx.TransportError, StopAsyncIteration) as e:
                if upstream is not None:
                    await upstream.aclose()
                self._failed(replica, e)
                errors.append(f"; {replica.url} failed: {_describe(e)}")
                continue
            except BaseException:  # cancelled (the router shuts down): the replica's slot is still given back
                with anyio.CancelScope(shield=True):
                    if upstream is not None:
                        await upstream.aclose()
                self.state.release(replica)
                raise
            return StreamingResponse(self._relay(replica, upstream, first, events), upstream.status_code,
                                     _returned(upstream.headers))
        if not any(r.alive for r in self.state.replicas):
            raise APIError(503, f"no replica is alive to serve {path}" + "".join(errors), code="no_replica_available")
        raise APIError(503, f"{path} failed on two replicas" + "".join(errors), code="replicas_failed")

    async def _relay(self, replica: Replica, upstream: httpx.Response, first: bytes, events):
        """Pass the stream on event by event; a broken stream ends with an error event and [DONE]."""
        failed = False
        try:
            yield first
            async for event in events:
                yield event
        except httpx.TransportError as e:
            failed = True
            self._failed(replica, e, counted=False)
            yield sse(error_body(503, f"the replica {replica.url} failed mid-stream: {_describe(e)}",
                                 code="replica_failed"))
            yield sse("[DONE]")
        finally:
            with anyio.CancelScope(shield=True):  # a client that left cancels us: still close upstream
                await upstream.aclose()
            self.state.release(replica, failed)

    def _failed(self, replica: Replica, error: Exception, counted: bool = True) -> None:
        """A refused or dropped connection takes the replica out; a timeout is left to the health check."""
        if isinstance(error, httpx.NetworkError | httpx.RemoteProtocolError | StopAsyncIteration):
            self.state.mark_dead(replica, _describe(error))
        if counted:
            self.state.release(replica, failed=True)

    async def health_loop(self, client: httpx.AsyncClient) -> None:
        """Every health_interval seconds, from one interval after the start (replicas start in rotation; one
        that is down by then is found by its first refused request or by this check, whichever comes first)."""
        while True:
            await asyncio.sleep(self.health_interval)
            await asyncio.gather(*(self._check(client, r) for r in self.state.replicas))

    async def _check(self, client: httpx.AsyncClient, replica: Replica) -> None:
        try:
            ok = (await client.get(replica.url + "/health")).status_code == 200
            error = "GET /health did not answer 200"
        except httpx.HTTPError as e:
            ok, error = False, f"GET /health: {_describe(e)}"
        if ok and not replica.alive:
            self.state.mark_alive(replica)
        elif not ok and replica.alive:
            self.state.mark_dead(replica, error)


async def _events(upstream: httpx.Response):
    """Whole SSE events as they complete, so a stream cut mid-event never passes on half of one
    (a stream that ends inside an event raises RemoteProtocolError)."""
    buffer = b""
    async for chunk in upstream.aiter_raw():
        buffer += chunk
        while (end := buffer.find(EVENT_END)) >= 0:
            yield buffer[:end + len(EVENT_END)]
            buffer = buffer[end + len(EVENT_END):]
    if buffer.strip():
        raise httpx.RemoteProtocolError(f"the stream ended inside an event: {buffer[:80]!r}")


def _returned(headers: httpx.Headers) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() in RETURNED_HEADERS}


def _describe(error: Exception) -> str:
    if isinstance(error, StopAsyncIteration):
        return "the stream ended before its first event"
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


# Module-level endpoints that find the router through the request: FastAPI caches every endpoint callable for
# the process's life, so one holding the router (a closure) would keep each stopped router alive.
async def proxy(request: Request) -> Response:
    headers = {k: v for k, v in request.headers.items() if k.lower() in PASSED_HEADERS}
    return await request.app.state.router.forward(request.method, request.url.path, await request.body(), headers)


async def health(request: Request):
    state = request.app.state.router.state
    replicas = [{"url": r.url, "alive": r.alive, "in_flight": r.in_flight} for r in state.replicas]
    alive = any(r["alive"] for r in replicas)
    return JSONResponse({"status": "ok" if alive else "no replica alive", "replicas": replicas},
                        status_code=200 if alive else 503)


async def metrics(request: Request):
    return Response(generate_latest(request.app.state.metrics_registry), media_type=CONTENT_TYPE_LATEST)


ROUTES = [("POST", "/v1/completions", proxy), ("POST", "/v1/chat/completions", proxy), ("GET", "/v1/models", proxy),
          ("GET", "/health", health), ("GET", "/metrics", metrics)]


def build_router(urls: list[str], policy: str = "prefix_aware", model: str = "tiny", timeouts: Timeouts = Timeouts(),
                 health_interval: float = 1.0, block_size: int = 16, index_capacity: int = 65_536) -> FastAPI:
    """The router's app over replica base URLs. model: its tokenizer and chat template (the replicas')."""
    state = RouterState(urls, policy, block_size, index_capacity)
    router = Router(state, model, timeouts, health_interval)
    registry = metrics_registry(state)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        timeout = httpx.Timeout(timeouts.read, connect=timeouts.connect)
        async with httpx.AsyncClient(timeout=timeout, limits=limits) as client, \
                httpx.AsyncClient(timeout=timeouts.health) as health_client:
            router.client = client
            checker = asyncio.create_task(router.health_loop(health_client))
            yield
            checker.cancel()

    app = FastAPI(title="minillm router", summary="cache-aware routing over OpenAI-compatible replicas",
                  lifespan=lifespan)
    app.state.router, app.state.metrics_registry = router, registry
    install_error_handlers(app)

    for method, path, endpoint in ROUTES:
        app.add_api_route(path, endpoint, methods=[method])
    return app
