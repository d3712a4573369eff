"""build_app: the OpenAI-compatible HTTP API over one AsyncLLM (one engine per server).

    POST /v1/completions        prompt(s) -> text; stream=true sends server-sent events
    POST /v1/chat/completions   messages -> the chat template -> a prompt -> an assistant message
    GET  /v1/models[/{id}]      the one model served
    GET  /health                liveness (open even with an API key); HEAD too
    GET  /metrics               Prometheus text format; HEAD too

Streams are `data: {json}\\n\\n` events ending with `data: [DONE]\\n\\n`. A client that disconnects
mid-stream closes its response's generator (Starlette listens for the disconnect and cancels it),
which aborts its engine requests at once (serve/generation.py); a non-streaming request watches
for its client's disconnect while it waits, and aborts the same way. With `max_waiting`, a request
whose sequences (prompts x n) would queue past that many is refused with 429 and a Retry-After from
`admission(num_waiting, max_waiting, drain_rate)`; a request that only scores its prompts (max_tokens 0)
counts the same, as waiting while it is scored. Bodies over `max_body_bytes` get 413 before
they are read whole. At shutdown, `end_streams()` (called as the grace period runs out) ends every
open stream with an error event and `[DONE]`.
"""
import asyncio
import math
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

from minillm.async_llm import AsyncLLM
from minillm.chat_template import ChatTemplate
from minillm.outputs import StreamChunk
from minillm.serve.admission import DrainRate, admit
from minillm.serve.auth import RequireAPIKey
from minillm.serve.body_limit import DEFAULT_MAX_BODY_BYTES, LimitBody
from minillm.serve.chat import chat_complete
from minillm.serve.completions import complete
from minillm.serve.errors import APIError, error_body, install_error_handlers
from minillm.serve.generation import Generation
from minillm.serve.limits import DEFAULT_LIMITS, RequestLimits
from minillm.serve.openapi import GENERATION, LISTING, MODEL, PROMETHEUS, drop_422
from minillm.serve.protocol import ChatRequest, CommonRequest, CompletionRequest
from minillm.serve.responses import new_id, sse
from minillm.serve.server_metrics import CountRequests, ServerMetrics

DISCONNECT_POLL_S = 0.25  # how often a non-streaming request checks that its client is still there


class OpenAIServer:
    """The endpoints' state: the engine, the served name, admission, metrics, the chat template."""

    def __init__(self, llm: AsyncLLM, model_name: str, max_waiting: int | None, admission,
                 limits: RequestLimits) -> None:
        self.llm, self.model_name, self.max_waiting, self.admission = llm, model_name, max_waiting, admission
        self.limits = limits
        self.tokenizer = llm.engine.tokenizer
        self.template = ChatTemplate.for_model(llm.engine.model_dir)
        self.vocab_size = llm.engine.model_config.vocab_size
        self.metrics, self.drain = ServerMetrics(), DrainRate()
        self.generations: set[Generation] = set()  # open ones, for end_streams()
        self.admitting = 0  # sequences admitted whose prompts are still being processed

    def on_chunk(self, chunk: StreamChunk) -> None:
        if chunk.output is not None:
            self.metrics.observe(chunk.output)
            self.drain.record()  # a sequence finished: admission counts sequences
        if chunk.request is not None:
            self.metrics.prompt_tokens.inc(len(chunk.request.prompt_token_ids))

    def end_streams(self) -> None:
        """The shutdown's grace period is over: every open request ends now with a 503 error (an
        error event and [DONE] on a stream), and its engine requests are aborted."""
        for gen in list(self.generations):
            gen.cut(APIError(503, "the server is shutting down: its grace period ended before this request "
                             "finished", code="server_shutting_down"))

    def check_model(self, body: CommonRequest) -> None:
        if body.model != self.model_name:
            raise APIError(404, f"model {body.model!r} does not exist: this server serves {self.model_name!r}",
                           param="model", code="model_not_found")

    async def room(self, prompts: list[str | list[int]], n: int) -> int:
        """The most tokens every prompt (with n samples) has room for, in the context and the KV pool: the
        cap of a default max_tokens, so that a request that leaves it out is always servable. Tokenizing
        runs in a worker thread; a prompt the engine would refuse -> 400."""
        engine = self.llm.engine
        try:
            lengths = await asyncio.to_thread(lambda: [len(engine.input_processor.prompt_ids(p)[1]) for p in prompts])
        except ValueError as e:
            raise APIError(400, str(e), param="prompt") from None
        return min(engine.input_processor.max_new_tokens(length, n) for length in lengths)

    async def open(self, body: CommonRequest, prompts: list, max_tokens: int, logprobs: int | None,
                   prefix: str) -> Generation:
        """Check the model and the queue, build the SamplingParams, queue the prompts."""
        self.check_model(body)
        try:
            self.limits.check_stop(body.stop)
        except ValueError as e:
            raise APIError(400, str(e), param="stop") from None
        try:
            params = body.sampling_params(max_tokens, logprobs, self.vocab_size)
        except ValueError as e:
            raise APIError(400, str(e)) from None
        async with self.admitted(len(prompts) * params.n):  # waiting while tokenized, before the engine has them
            gen = await Generation(self.llm, new_id(prefix), self.on_chunk).start(prompts, params)
        self.generations.add(gen)
        return gen

    @asynccontextmanager
    async def admitted(self, sequences: int):
        """Admit the sequences (or raise 400/429), and count them as waiting until the block ends: the
        engine's queue does not hold them yet (being tokenized) or ever (a prompt scored by a forward)."""
        self.admit(sequences)
        self.admitting += sequences
        try:
            yield
        finally:
            self.admitting -= sequences

    def admit(self, sequences: int) -> None:
        """Admission counts sequences: a request brings one per prompt and sample, scored or generated."""
        if self.max_waiting is None:
            return
        if sequences > self.max_waiting:
            raise APIError(400, f"this request brings {sequences} sequences (prompts x n), more than the server "
                           f"queues at once (max_waiting {self.max_waiting}): send fewer prompts or a smaller n")
        waiting = self.llm.num_waiting_seqs + self.admitting
        retry = self.admission(waiting + sequences - 1, self.max_waiting, self.drain.rate())
        if retry is not None:
            raise APIError(429, f"the server is busy: {waiting} sequences are waiting and this request brings "
                           f"{sequences} (max_waiting {self.max_waiting}); retry after {retry:g} s",
                           code="rate_limit_exceeded", headers={"Retry-After": str(math.ceil(retry))})

    async def collect(self, gen: Generation, request: Request) -> dict:
        """-> {(prompt index, sample index): Completion}, once every request is finished. A client that
        disconnects meanwhile aborts them (their blocks are freed) and the answer is a 499."""
        async def gather() -> dict:
            return {(i, chunk.index): chunk.output async for i, chunk in gen.chunks() if chunk.output is not None}

        task = asyncio.ensure_future(gather())
        try:
            while not (await asyncio.wait({task}, timeout=DISCONNECT_POLL_S))[0]:
                if await request.is_disconnected():
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)  # its chunks' clean-up aborts
                    raise APIError(499, "the client closed the connection before the answer was ready",
                                   code="client_closed_request")
            return task.result()
        finally:
            self.generations.discard(gen)
            if not task.done():  # cancelled from outside (the server stopping)
                task.cancel()

    def streaming(self, gen: Generation | None, events) -> StreamingResponse:
        """Server-sent events from dicts; an error mid-stream becomes an error event (the status is sent).
        Every stream ends with [DONE], even one cut short by a shutdown."""
        async def body():
            try:
                async for payload in events:
                    yield sse(payload)
            except APIError as e:
                self.metrics.stream_errors.labels(str(e.status)).inc()
                yield sse(error_body(e.status, e.message, e.param, e.code))
            finally:
                self.generations.discard(gen)
            yield sse("[DONE]")
        return StreamingResponse(body(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


# The endpoints are module-level functions that find their server through the request. FastAPI keeps every
# endpoint callable in a process-wide cache (4,096 entries): an endpoint that held its server (a bound method,
# a closure) kept each stopped server's engine and KV pool alive, 280 MB a server on tiny.
async def completions(body: CompletionRequest, request: Request):
    return await complete(request.app.state.server, body, request)


async def chat(body: ChatRequest, request: Request):
    return await chat_complete(request.app.state.server, body, request)


def _model_card(server: OpenAIServer) -> dict:
    return {"id": server.model_name, "object": "model", "created": 0, "owned_by": "minillm",
            "max_model_len": server.llm.engine.max_model_len}


async def models(request: Request):
    return {"object": "list", "data": [_model_card(request.app.state.server)]}


async def model(model_id: str, request: Request):
    server = request.app.state.server
    if model_id != server.model_name:
        raise APIError(404, f"model {model_id!r} does not exist: this server serves {server.model_name!r}",
                       param="model", code="model_not_found")
    return _model_card(server)


async def health():
    return JSONResponse({"status": "ok"})


async def metrics(request: Request):
    server = request.app.state.server
    return Response(server.metrics.render(server.llm), media_type=CONTENT_TYPE_LATEST)


ROUTES = [(["POST"], "/v1/completions", completions, GENERATION),
          (["POST"], "/v1/chat/completions", chat, GENERATION),
          (["GET"], "/v1/models", models, LISTING), (["GET"], "/v1/models/{model_id}", model, MODEL),
          (["GET"], "/health", health, {}), (["GET"], "/metrics", metrics, PROMETHEUS)]
PROBED = [("/health", health), ("/metrics", metrics)]  # HEAD too, for load balancers and uptime checks


def build_app(llm: AsyncLLM, model_name: str, api_key: str | None = None, max_waiting: int | None = None,
              admission=admit, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
              limits: RequestLimits = DEFAULT_LIMITS) -> FastAPI:
    """The FastAPI app serving llm as model_name. api_key: required as a Bearer token when set.
    max_waiting: refuse (429) while this many sequences wait (None: never). admission: the policy.
    max_body_bytes: larger request bodies are refused with 413. limits: the other bounds (serve/limits.py)."""
    server = OpenAIServer(llm, model_name, max_waiting, admission, limits)
    # Imported now, not at the first structured request: importing xgrammar takes seconds and holds
    # the GIL for stretches of a third of one, which would freeze every open stream meanwhile.
    import xgrammar  # noqa: F401

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        await llm.shutdown()  # after uvicorn's graceful drain: abort whatever still runs

    app = FastAPI(title="minillm", summary="an OpenAI-compatible API over minillm", lifespan=lifespan)
    app.state.server = server
    app.state.end_streams = server.end_streams  # serve/server.py calls it as a shutdown's grace period ends
    install_error_handlers(app)
    app.add_middleware(LimitBody, max_bytes=max_body_bytes)
    if api_key:
        app.add_middleware(RequireAPIKey, api_key=api_key)
    app.add_middleware(CountRequests, metrics=server.metrics)  # outermost: counts 401s, 413s and 500s too

    for methods, path, endpoint, responses in ROUTES:
        app.add_api_route(path, endpoint, methods=methods, responses=responses)
    for path, endpoint in PROBED:  # the GET documents it; a second operation would repeat its id
        app.add_api_route(path, endpoint, methods=["HEAD"], include_in_schema=False)
    drop_422(app)
    return app
