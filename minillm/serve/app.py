"""build_app: the OpenAI-compatible HTTP API over one AsyncLLM (one engine per server).

    POST /v1/completions        prompt(s) -> text; stream=true sends server-sent events
    POST /v1/chat/completions   messages -> the chat template -> a prompt -> an assistant message
    GET  /v1/models             the one model served
    GET  /health                liveness (open even with an API key)
    GET  /metrics               Prometheus text format

Streams are `data: {json}\\n\\n` events ending with `data: [DONE]\\n\\n`. A client that disconnects
mid-stream closes its response's generator (Starlette listens for the disconnect and cancels it),
which aborts its engine requests at once (serve/generation.py). With `max_waiting`, a request
arriving when the engine's queue is that deep is refused with 429 and a Retry-After from
`admission(num_waiting, max_waiting, drain_rate)`.
"""
import math
from collections import defaultdict
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

from minillm.async_llm import AsyncLLM
from minillm.chat_template import ChatTemplate
from minillm.outputs import StreamChunk
from minillm.serve.admission import DrainRate, admit
from minillm.serve.auth import RequireAPIKey
from minillm.serve.errors import APIError, error_body, install_error_handlers
from minillm.serve.generation import Generation
from minillm.serve.metrics import CountRequests, ServerMetrics
from minillm.serve.protocol import ChatRequest, CommonRequest, CompletionRequest
from minillm.serve.responses import (
    chat_choice,
    chat_logprobs,
    completion_choice,
    completion_logprobs,
    envelope,
    new_id,
    sse,
)

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


class OpenAIServer:
    """The endpoints' state: the engine, the served name, admission, metrics, the chat template."""

    def __init__(self, llm: AsyncLLM, model_name: str, max_waiting: int | None, admission) -> None:
        self.llm, self.model_name, self.max_waiting, self.admission = llm, model_name, max_waiting, admission
        self.tokenizer = llm.engine.tokenizer
        self.template = ChatTemplate.for_model(llm.engine.model_dir)
        self.metrics, self.drain = ServerMetrics(), DrainRate()

    def on_chunk(self, chunk: StreamChunk) -> None:
        if chunk.output is not None:
            self.metrics.observe(chunk.output)
        if chunk.request is not None:
            self.metrics.prompt_tokens.inc(len(chunk.request.prompt_token_ids))
            self.drain.record()

    async def open(self, body: CommonRequest, prompts: list, max_tokens: int, logprobs: int | None,
                   prefix: str) -> Generation:
        """Check the model and the queue, build the SamplingParams, queue the prompts."""
        if body.model != self.model_name:
            raise APIError(404, f"model {body.model!r} does not exist: this server serves {self.model_name!r}",
                           param="model", code="model_not_found")
        if self.max_waiting is not None:
            waiting = self.llm.num_waiting
            retry = self.admission(waiting, self.max_waiting, self.drain.rate())
            if retry is not None:
                raise APIError(429, f"the server is busy: {waiting} requests are waiting (max_waiting "
                               f"{self.max_waiting}); retry after {retry:g} s", code="rate_limit_exceeded",
                               headers={"Retry-After": str(math.ceil(retry))})
        try:
            params = body.sampling_params(max_tokens, logprobs)
        except ValueError as e:
            raise APIError(400, str(e)) from None
        return await Generation(self.llm, new_id(prefix), self.on_chunk).start(prompts, params)

    # -- /v1/completions -------------------------------------------------------------------------
    async def completions(self, body: CompletionRequest):
        gen = await self.open(body, body.prompts(), body.max_tokens or COMPLETIONS_DEFAULT_MAX_TOKENS,
                              body.logprobs, "cmpl")
        if body.stream:
            return streaming(self.completion_events(body, gen))
        outputs = await collect(gen)
        choices = [completion_choice(self.tokenizer, i * body.n + j, c) for (i, j), c in sorted(outputs.items())]
        return envelope(gen.request_id, "text_completion", self.model_name, choices,
                        usage=gen.usage())

    async def completion_events(self, body: CompletionRequest, gen: Generation):
        offsets = defaultdict(int)  # per choice: text offset of its next token (logprobs' text_offset)
        extra = {"usage": None} if body.include_usage else {}
        async for i, chunk in gen.chunks():
            index, lp = i * body.n + chunk.index, None
            if chunk.logprobs is not None:
                lp = completion_logprobs(self.tokenizer, chunk.token_ids, chunk.logprobs, offsets[index])
                offsets[index] += sum(len(t) for t in lp["tokens"])
            if chunk.text or chunk.finished or lp:
                choice = {"index": index, "text": chunk.text, "logprobs": lp,
                          "finish_reason": chunk.output.finish_reason if chunk.finished else None}
                yield envelope(gen.request_id, "text_completion", self.model_name, [choice], **extra)
        if body.include_usage:
            yield envelope(gen.request_id, "text_completion", self.model_name, [], usage=gen.usage())

    # -- /v1/chat/completions --------------------------------------------------------------------
    async def chat(self, body: ChatRequest):
        try:
            prompt = self.template.render([m.model_dump(exclude_none=True) for m in body.messages])
        except ValueError as e:
            raise APIError(400, str(e), param="messages") from None
        room = self.llm.engine.max_model_len - len(self.tokenizer.encode(prompt))
        if body.requested_max_tokens is None and room < 1:
            raise APIError(400, f"the messages take {self.llm.engine.max_model_len - room} tokens: no room is left "
                           f"in the context of {self.llm.engine.max_model_len} tokens", param="messages")
        gen = await self.open(body, [prompt], body.requested_max_tokens or room, body.engine_logprobs, "chatcmpl")
        if body.stream:
            return streaming(self.chat_events(body, gen))
        outputs = await collect(gen)
        choices = [chat_choice(self.tokenizer, j, c, body.top_logprobs or 0) for (_, j), c in sorted(outputs.items())]
        return envelope(gen.request_id, "chat.completion", self.model_name, choices,
                        usage=gen.usage())

    async def chat_events(self, body: ChatRequest, gen: Generation):
        extra = {"usage": None} if body.include_usage else {}

        def event(index: int, delta: dict, finish_reason: str | None = None, logprobs: dict | None = None) -> dict:
            choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
            return envelope(gen.request_id, "chat.completion.chunk", self.model_name, [choice], **extra)

        for j in range(body.n):  # OpenAI's first delta of each choice names the role
            yield event(j, {"role": "assistant", "content": ""})
        async for _, chunk in gen.chunks():
            lp = None if chunk.logprobs is None else \
                chat_logprobs(self.tokenizer, chunk.token_ids, chunk.logprobs, body.top_logprobs or 0)
            if chunk.text or lp:
                yield event(chunk.index, {"content": chunk.text}, logprobs=lp)
            if chunk.finished:
                yield event(chunk.index, {}, chunk.output.finish_reason)
        if body.include_usage:
            yield envelope(gen.request_id, "chat.completion.chunk", self.model_name, [], usage=gen.usage())


async def collect(gen: Generation) -> dict:
    """-> {(prompt index, sample index): Completion}, once every request is finished."""
    return {(i, chunk.index): chunk.output async for i, chunk in gen.chunks() if chunk.output is not None}


def streaming(events) -> StreamingResponse:
    """Server-sent events from dicts; an error mid-stream becomes an error event (the status is sent)."""
    async def body():
        try:
            async for payload in events:
                yield sse(payload)
        except APIError as e:
            yield sse(error_body(e.status, e.message, e.param, e.code))
        yield sse("[DONE]")
    return StreamingResponse(body(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


# The endpoints are module-level functions that find their server through the request. FastAPI keeps every
# endpoint callable in a process-wide cache (4,096 entries): an endpoint that held its server (a bound method,
# a closure) kept each stopped server's engine and KV pool alive, 280 MB a server on tiny.
async def completions(body: CompletionRequest, request: Request):
    return await request.app.state.server.completions(body)


async def chat(body: ChatRequest, request: Request):
    return await request.app.state.server.chat(body)


async def models(request: Request):
    server = request.app.state.server
    return {"object": "list", "data": [{"id": server.model_name, "object": "model", "created": 0,
                                        "owned_by": "minillm", "max_model_len": server.llm.engine.max_model_len}]}


async def health():
    return JSONResponse({"status": "ok"})


async def metrics(request: Request):
    server = request.app.state.server
    return Response(server.metrics.render(server.llm), media_type=CONTENT_TYPE_LATEST)


ROUTES = [("POST", "/v1/completions", completions), ("POST", "/v1/chat/completions", chat),
          ("GET", "/v1/models", models), ("GET", "/health", health), ("GET", "/metrics", metrics)]


def build_app(llm: AsyncLLM, model_name: str, api_key: str | None = None, max_waiting: int | None = None,
              admission=admit) -> FastAPI:
    """The FastAPI app serving llm as model_name. api_key: required as a Bearer token when set.
    max_waiting: refuse (429) while this many requests wait (None: never). admission: the policy."""
    server = OpenAIServer(llm, model_name, max_waiting, admission)
    # Imported now, not at the first structured request: importing xgrammar takes seconds and holds
    # the GIL for stretches of a third of one, which would freeze every open stream meanwhile.
    import xgrammar  # noqa: F401

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        await llm.shutdown()  # after uvicorn's graceful drain: abort whatever still runs

    app = FastAPI(title="minillm", summary="an OpenAI-compatible API over minillm", lifespan=lifespan)
    app.state.server = server
    install_error_handlers(app)
    if api_key:
        app.add_middleware(RequireAPIKey, api_key=api_key)
    app.add_middleware(CountRequests, metrics=server.metrics)  # outermost: counts 401s too

    for method, path, endpoint in ROUTES:
        app.add_api_route(path, endpoint, methods=[method])
    return app
