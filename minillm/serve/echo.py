"""`echo` on /v1/completions: the prompt's text, tokens and log-probabilities ahead of the completion.

This is how evaluation harnesses score text (lm-eval's loglikelihood requests send `echo: true,
logprobs: 1, max_tokens: 0 or 1`): token i's log-probability is read from the logits at position
i - 1 of one forward over the prompt, so the first token has none (null). `max_tokens: 0` scores
the prompt without generating anything. On the server the forward runs in a worker thread
(AsyncLLM.logits), and so does everything that reads the vocabulary or decodes a token (the
log-softmax, each token's text and its top alternatives'), so the event loop never waits for them,
and the answer is encoded a choice at a time off the loop too (serve/json_pieces.py);
the Batch API calls the same steps in its own thread (echo_now).
"""
import asyncio

import torch

from minillm.async_llm import AsyncLLM
from minillm.engine.engine import LLMEngine
from minillm.engine.runner import full_forward_logits
from minillm.sampling import token_logprobs
from minillm.serve.responses import completion_logprobs, token_text
from minillm.tokenizer import Tokenizer


class EchoedPrompt:
    """One prompt as echo returns it: its ids, text, and its tokens' logprobs in the completions shape
    (the first token's logprob and top null; None when no logprobs were asked)."""

    def __init__(self, ids: list[int], text: str, logprobs: dict | None) -> None:
        self.ids, self.text, self.logprobs = ids, text, logprobs


def read_prompt(engine: LLMEngine, prompt: str | list[int]) -> tuple[list[int], str]:
    """-> the prompt's token ids and text. A prompt the engine would refuse (empty, ids outside the
    vocabulary, longer than the context) raises ValueError."""
    text, ids = engine.input_processor.prompt_ids(prompt)  # ids checked
    if text is None:
        text = engine.tokenizer.decode(ids, skip_special_tokens=False)
    limit = engine.max_model_len
    if len(ids) > limit:
        raise ValueError(f"the prompt has {len(ids)} tokens: it exceeds the context length of {limit} tokens")
    return ids, text


def echoed(tokenizer: Tokenizer, ids: list[int], text: str, logits: torch.Tensor | None,
           top: int | None) -> EchoedPrompt:
    """logits: [len, vocab] of the prompt (None: no logprobs asked) -> the prompt as echo returns it,
    each token with its logprob and the `top` likeliest."""
    if logits is None:
        return EchoedPrompt(ids, text, None)
    rows = [token_logprobs(logits[i - 1], ids[i], top) for i in range(1, len(ids))]
    first = token_text(tokenizer, ids[0])
    rest = completion_logprobs(tokenizer, ids[1:], rows, len(first))
    return EchoedPrompt(ids, text, {"tokens": [first, *rest["tokens"]],
                                    "token_logprobs": [None, *rest["token_logprobs"]],
                                    "top_logprobs": [None, *rest["top_logprobs"]],
                                    "text_offset": [0, *rest["text_offset"]]})


async def echo_prompt(llm: AsyncLLM, prompt: str | list[int], logprobs: int | None) -> EchoedPrompt:
    """The prompt, scored when logprobs are asked, all off the event loop; a refused prompt raises ValueError."""
    ids, text = await asyncio.to_thread(read_prompt, llm.engine, prompt)
    logits = None if logprobs is None else await llm.logits(ids)  # [len, vocab]
    return await asyncio.to_thread(echoed, llm.engine.tokenizer, ids, text, logits, logprobs)


def echo_now(engine: LLMEngine, prompt: str | list[int], logprobs: int | None) -> EchoedPrompt:
    """echo_prompt in the caller's thread (the Batch API, between the engine's steps)."""
    ids, text = read_prompt(engine, prompt)
    logits = None if logprobs is None else full_forward_logits(engine.model, ids, engine.max_model_len,
                                                                engine.device)
    return echoed(engine.tokenizer, ids, text, logits, logprobs)


def join_logprobs(prompt: dict | None, completion: dict | None) -> dict | None:
    """The echoed prompt's logprobs, then the completion's (its text offsets already count the prompt)."""
    if prompt is None or completion is None:
        return prompt or completion
    return {key: prompt[key] + completion[key] for key in completion}
