"""POST /v1/chat/completions: messages -> the chat template -> a prompt -> an assistant message,
whole or streamed (each choice's first delta names the role, as OpenAI's do).

The prompt is tokenized in a worker thread (a long conversation must not stall the other streams)
and refused at once when it leaves no room in the context. Without max_tokens the answer may take the
rest of the context, capped by what the KV pool could hold for this prompt, so the default is servable.
"""
import asyncio

from fastapi import Request

from minillm.serve.errors import APIError
from minillm.serve.generation import Generation
from minillm.serve.protocol import ChatRequest
from minillm.serve.responses import chat_choice, chat_logprobs, envelope


async def chat_complete(server, body: ChatRequest, request: Request):
    server.check_model(body)
    try:
        prompt = server.template.render(body.template_messages())
    except ValueError as e:
        raise APIError(400, str(e), param="messages") from None
    max_tokens = body.requested_max_tokens
    if max_tokens is None:  # the rest of the context, as far as the KV pool holds it
        max_tokens = await server.room([prompt], body.samples)
        if max_tokens < 1:
            taken = len(await asyncio.to_thread(server.tokenizer.encode, prompt))
            raise APIError(400, f"the messages take {taken} tokens: no room is left for an answer in the context "
                           f"of {server.llm.engine.max_model_len} tokens or the KV pool of "
                           f"{server.llm.kv_stats().total_blocks} blocks",
                           param="messages")
    gen = await server.open(body, [prompt], max_tokens, body.engine_logprobs, "chatcmpl")
    if body.stream:
        return server.streaming(gen, events(server, body, gen))
    outputs = await server.collect(gen, request)
    choices = [chat_choice(server.tokenizer, j, c, body.top_logprobs or 0) for (_, j), c in sorted(outputs.items())]
    return envelope(gen.request_id, "chat.completion", server.model_name, choices, usage=gen.usage())


async def events(server, body: ChatRequest, gen: Generation):
    def event(index: int, delta: dict, finish_reason: str | None = None, logprobs: dict | None = None) -> dict:
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
        usage_now = {"usage": gen.usage_so_far()} if body.continuous_usage else \
            {"usage": None} if body.include_usage else {}
        return envelope(gen.request_id, "chat.completion.chunk", server.model_name, [choice], **usage_now)

    for j in range(body.samples):  # OpenAI's first delta of each choice names the role
        yield event(j, {"role": "assistant", "content": ""})
    async for _, chunk in gen.chunks():
        lp = None if chunk.logprobs is None else \
            chat_logprobs(server.tokenizer, chunk.token_ids, chunk.logprobs, body.top_logprobs or 0)
        if chunk.text or lp:
            yield event(chunk.index, {"content": chunk.text}, logprobs=lp)
        if chunk.finished:
            yield event(chunk.index, {}, chunk.output.finish_reason)
    if body.include_usage:
        yield envelope(gen.request_id, "chat.completion.chunk", server.model_name, [], usage=gen.usage())
