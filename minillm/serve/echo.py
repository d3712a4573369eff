"""`echo` on /v1/completions: the prompt's text, tokens and log-probabilities ahead of the completion.

This is how evaluation harnesses score text (lm-eval's loglikelihood requests send `echo: true,
logprobs: 1, max_tokens: 0 or 1`): token i's log-probability is read from the logits at position
i - 1 of one forward over the prompt, so the first token has none (null). `max_tokens: 0` scores
the prompt without generating anything. The forward runs in a worker thread (AsyncLLM.logits),
and so does the log-softmax over the vocabulary, so the event loop never waits for either.
"""
import asyncio

import torch

from minillm.async_llm import AsyncLLM
from minillm.sampling import token_logprobs
from minillm.serve.responses import completion_logprobs, token_text
from minillm.tokenizer import Tokenizer


class EchoedPrompt:
    """One prompt as echo returns it: its ids, text, and per-token logprobs (None for the first token,
    and for all of them when no logprobs were asked)."""

    def __init__(self, ids: list[int], text: str, logprobs: list[dict[int, float] | None] | None) -> None:
        self.ids, self.text, self.logprobs = ids, text, logprobs

    def choice_logprobs(self, tokenizer: Tokenizer) -> dict:
        """The completions shape of the prompt's tokens: the first token's logprob and top are null."""
        first = token_text(tokenizer, self.ids[0])
        rest = completion_logprobs(tokenizer, self.ids[1:], self.logprobs[1:], len(first))
        return {"tokens": [first, *rest["tokens"]], "token_logprobs": [None, *rest["token_logprobs"]],
                "top_logprobs": [None, *rest["top_logprobs"]], "text_offset": [0, *rest["text_offset"]]}


def _rows(logits: torch.Tensor, ids: list[int], top: int) -> list[dict[int, float] | None]:
    """logits: [len, vocab] of the prompt -> per token, its logprob and the `top` likeliest (None first)."""
    return [None] + [token_logprobs(logits[i - 1], ids[i], top) for i in range(1, len(ids))]


async def echo_prompt(llm: AsyncLLM, prompt: str | list[int], logprobs: int | None) -> EchoedPrompt:
    """Tokenize (off the loop) and, when logprobs are asked, score the prompt in one forward.
    A prompt the engine would refuse (empty, ids outside the vocabulary, longer than the context)
    raises ValueError."""
    text, ids = await asyncio.to_thread(llm.engine.input_processor.prompt_ids, prompt)  # ids checked
    if text is None:
        text = await asyncio.to_thread(llm.engine.tokenizer.decode, ids, skip_special_tokens=False)
    limit = llm.engine.max_model_len
    if len(ids) > limit:
        raise ValueError(f"the prompt has {len(ids)} tokens: it exceeds the context length of {limit} tokens")
    if logprobs is None:
        return EchoedPrompt(ids, text, None)
    logits = await llm.logits(ids)  # [len, vocab]
    return EchoedPrompt(ids, text, await asyncio.to_thread(_rows, logits, ids, logprobs))


def join_logprobs(prompt: dict | None, completion: dict | None) -> dict | None:
    """The echoed prompt's logprobs, then the completion's (its text offsets already count the prompt)."""
    if prompt is None or completion is None:
        return prompt or completion
    return {key: prompt[key] + completion[key] for key in completion}
