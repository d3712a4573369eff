"""POST /v1/completions: prompts -> completions, whole or streamed, with `echo` and prompt scoring.

A request's prompts each become an engine request with n samples; choice i * n + j is prompt i's
sample j. With `echo`, each choice starts with its prompt (text, tokens, and logprobs whose first
is null: serve/echo.py). `max_tokens: 0` generates nothing: the prompts are only scored, through
one forward each (AsyncLLM.logits, in a worker thread), never through a fake generation.
"""
from fastapi import Request

from minillm.outputs import Completion
from minillm.serve.echo import EchoedPrompt, echo_prompt, join_logprobs
from minillm.serve.errors import APIError
from minillm.serve.generation import Generation
from minillm.serve.json_pieces import json_in_pieces
from minillm.serve.protocol import CompletionRequest
from minillm.serve.responses import completion_logprobs, envelope, new_id, usage
from minillm.tokenizer import Tokenizer

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


async def echoes(server, body: CompletionRequest, request: Request) -> list[EchoedPrompt] | None:
    """The prompts as echo returns them (None without echo or scoring); a prompt over the context -> 400.
    Their forwards are work the engine's queue never sees, so they are admitted like a generation: the
    request's prompts x n sequences wait (for admission) until they are scored. A client that leaves
    meanwhile stops the scoring at the next prompt (499)."""
    if not body.echo and body.max_tokens != 0:
        return None
    prompts = body.prompts()
    out = []
    async with server.admitted(len(prompts) * body.samples):
        for i, prompt in enumerate(prompts):
            if await request.is_disconnected():
                raise APIError(499, f"the client closed the connection while its prompts were scored "
                               f"({i} of {len(prompts)} done)", code="client_closed_request")
            try:
                out.append(await echo_prompt(server.llm, prompt, body.logprobs if body.echo else None))
            except ValueError as e:
                raise APIError(400, f"prompt {i}: {e}", param="prompt") from None
    return out


def choice(index: int, echoed: EchoedPrompt | None, text: str, logprobs: dict | None,
           finish_reason: str | None) -> dict:
    """One choice; with echo, the prompt's text and logprobs come first."""
    if echoed is not None:
        text, logprobs = echoed.text + text, join_logprobs(echoed.logprobs, logprobs)
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}


def generated_choices(tokenizer: Tokenizer, body: CompletionRequest, shown: list[EchoedPrompt | None],
                      outputs: dict[tuple[int, int], Completion]) -> list[dict]:
    """A whole answer's choices from {(prompt index, sample index): its completion}; shown[i]: prompt i as
    echoed ahead of its choices (None without echo). Also the Batch API's, so the two answer alike."""
    choices = []
    for (i, j), c in sorted(outputs.items()):
        start = len(shown[i].text) if shown[i] else 0  # text_offset counts the echoed prompt
        lp = None if c.logprobs is None else completion_logprobs(tokenizer, c.token_ids, c.logprobs, start)
        choices.append(choice(i * body.samples + j, shown[i], c.text, lp, c.finish_reason))
    return choices


def scored_choices(body: CompletionRequest, prompts: list[EchoedPrompt]) -> list[dict]:
    """max_tokens 0: each choice is its prompt (with echo) or empty, finished by length at once."""
    n = body.samples
    return [choice(i * n + j, p if body.echo else None, "", None, "length")
            for i, p in enumerate(prompts) for j in range(n)]


async def complete(server, body: CompletionRequest, request: Request):
    server.check_model(body)
    max_tokens = body.max_tokens
    if max_tokens is None:  # OpenAI's 16, or fewer where a prompt leaves less room (context, KV pool)
        room = await server.room(body.prompts(), body.samples)
        max_tokens = min(DEFAULT_MAX_TOKENS, room) if room else DEFAULT_MAX_TOKENS  # none: the engine's 400 says why
    prompts = await echoes(server, body, request)
    if max_tokens == 0:
        return scored(server, body, prompts)
    shown = prompts if body.echo else [None] * len(body.prompts())
    gen = await server.open(body, body.prompts(), max_tokens, body.logprobs, "cmpl")
    if body.stream:
        return server.streaming(gen, events(server, body, gen, shown))
    choices = generated_choices(server.tokenizer, body, shown, await server.collect(gen, request))
    answer = envelope(gen.request_id, "text_completion", server.model_name, choices, usage=gen.usage())
    return json_in_pieces(answer) if body.echo else answer  # an echoed prompt's logprobs: megabytes


def scored(server, body: CompletionRequest, prompts: list[EchoedPrompt]):
    """max_tokens 0: the prompts scored, answered whole or as a stream of one chunk per choice."""
    rid, choices = new_id("cmpl"), scored_choices(body, prompts)
    server.drain.record(len(choices))  # finished sequences, as admission counted them
    total = usage(sum(len(p.ids) for p in prompts), 0)
    if not body.stream:
        return json_in_pieces(envelope(rid, "text_completion", server.model_name, choices, usage=total))

    async def chunks():
        extra = {"usage": total} if body.continuous_usage else {"usage": None} if body.include_usage else {}
        for one in choices:
            yield envelope(rid, "text_completion", server.model_name, [one], **extra)
        if body.include_usage:
            yield envelope(rid, "text_completion", server.model_name, [], usage=total)
    return server.streaming(None, chunks())


async def events(server, body: CompletionRequest, gen: Generation, shown: list[EchoedPrompt | None]):
    """The stream's chunks: with echo, each choice's first chunk carries its prompt."""
    offsets: dict[int, int] = {}  # per choice: text offset of its next token (logprobs' text_offset)
    async for i, chunk in gen.chunks():
        index, lp, echoed = i * body.samples + chunk.index, None, None
        if index not in offsets:
            echoed = shown[i]
            offsets[index] = len(echoed.text) if echoed else 0
        if chunk.logprobs is not None:
            lp = completion_logprobs(server.tokenizer, chunk.token_ids, chunk.logprobs, offsets[index])
            offsets[index] += sum(len(t) for t in lp["tokens"])
        if chunk.text or chunk.finished or lp or echoed:
            one = choice(index, echoed, chunk.text, lp, chunk.output.finish_reason if chunk.finished else None)
            usage_now = {"usage": gen.usage_so_far()} if body.continuous_usage else \
                {"usage": None} if body.include_usage else {}
            yield envelope(gen.request_id, "text_completion", server.model_name, [one], **usage_now)
    if body.include_usage:
        yield envelope(gen.request_id, "text_completion", server.model_name, [], usage=gen.usage())
