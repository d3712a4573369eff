"""OpenAI's response shapes, built from the engine's outputs: usage, log-probabilities, and the
choices of completions and chat completions, whole or streamed.

The engine reports, per output token, a dict {token id: logprob} holding the sampled token and
the k likeliest (so k or k + 1 entries). OpenAI has two shapes for it:

    completions  {"tokens": [str], "token_logprobs": [float], "top_logprobs": [{str: float}],
                  "text_offset": [int]}                    (top_logprobs: the whole dict)
    chat         {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob",
                  "bytes"}]}]}                             (top_logprobs: exactly the k likeliest)
"""
import json
import time
import uuid

from minillm.tokenizer import Tokenizer


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def envelope(id_: str, kind: str, model: str, choices: list[dict], **extra) -> dict:
    """kind: text_completion | chat.completion | chat.completion.chunk."""
    return {"id": id_, "object": kind, "created": int(time.time()), "model": model, "choices": choices, **extra}


def completion_choice(tokenizer: Tokenizer, index: int, completion) -> dict:
    """One choice of a finished /v1/completions answer; completion: a CompletionOutput."""
    c = completion
    return {"index": index, "text": c.text, "finish_reason": c.finish_reason,
            "logprobs": None if c.logprobs is None else completion_logprobs(tokenizer, c.token_ids, c.logprobs, 0)}


def chat_choice(tokenizer: Tokenizer, index: int, completion, top_logprobs: int) -> dict:
    """One choice of a finished /v1/chat/completions answer; completion: a CompletionOutput."""
    c = completion
    return {"index": index, "message": {"role": "assistant", "content": c.text}, "finish_reason": c.finish_reason,
            "logprobs": None if c.logprobs is None else chat_logprobs(tokenizer, c.token_ids, c.logprobs, top_logprobs)}


def sse(payload: dict | str) -> str:
    """One server-sent event: `data: <json>` and a blank line (`[DONE]` ends the stream)."""
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n"


def token_text(tokenizer: Tokenizer, token_id: int) -> str:
    # special tokens (EOS) are part of what was sampled, so they are shown, not skipped
    return tokenizer.decode([token_id], skip_special_tokens=False)


def _ranked(top: dict[int, float]) -> list[tuple[int, float]]:
    return sorted(top.items(), key=lambda kv: -kv[1])


def completion_logprobs(tokenizer: Tokenizer, token_ids: list[int], logprobs: list[dict[int, float]],
                        offset: int) -> dict:
    """The completions shape for these tokens; offset: the text offset of the first one."""
    tokens = [token_text(tokenizer, t) for t in token_ids]
    offsets = []
    for text in tokens:
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": [lp[t] for t, lp in zip(token_ids, logprobs)],
            "top_logprobs": [{token_text(tokenizer, i): v for i, v in _ranked(lp)} for lp in logprobs],
            "text_offset": offsets}


def _chat_entry(tokenizer: Tokenizer, token_id: int, logprob: float) -> dict:
    text = token_text(tokenizer, token_id)
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}


def chat_logprobs(tokenizer: Tokenizer, token_ids: list[int], logprobs: list[dict[int, float]], top: int) -> dict:
    """The chat shape for these tokens, with the `top` likeliest alternatives of each."""
    return {"content": [{**_chat_entry(tokenizer, t, lp[t]),
                         "top_logprobs": [_chat_entry(tokenizer, i, v) for i, v in _ranked(lp)[:top]]}
                        for t, lp in zip(token_ids, logprobs)]}
