"""LLM: the front door. Load a model once, then generate, stream, chat, or inspect logits.

    llm = LLM()                                    # the bundled `tiny` model, offline
    outs = llm.generate(["def fib(n):"], SamplingParams(max_tokens=32, temperature=0))
    for chunk in llm.stream("class Stack:"): print(chunk.text, end="")
    LLM("smollm2-135m-instruct").chat([{"role": "user", "content": "Hi!"}])[0].text
"""
import functools
from collections.abc import Iterator

import torch
from tqdm.auto import tqdm

from minillm.chat_template import ChatTemplate
from minillm.config import EngineConfig
from minillm.engine.engine import LLMEngine
from minillm.engine.runner import full_forward_logits
from minillm.outputs import RequestOutput, StreamChunk
from minillm.sampling import SamplingParams


def paired(prompts, params) -> tuple[list, list[SamplingParams]]:
    """generate()'s arguments as a list of prompts and one SamplingParams each: a single prompt (text or
    token ids) becomes a list of one, a single SamplingParams (or None) is shared by every prompt."""
    if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
        prompts = [prompts]
    if not isinstance(params, list):
        params = [params or SamplingParams()] * len(prompts)
    if len(params) != len(prompts):
        raise ValueError(f"got {len(params)} SamplingParams for {len(prompts)} prompts")
    return prompts, params


class LLM:
    """The synchronous front door: one engine on one loaded model. generate() runs prompts to completion
    (batched), stream() yields one request's chunks as they are decoded, chat() and stream_chat() apply the
    model's chat template, logits() returns one full forward's logits. `engine` is the LLMEngine it drives."""
    def __init__(self, model: str | None = None, weights: torch.nn.Module | None = None, **config) -> None:
        """model: a bundled model name ("tiny", "pico") or a Hugging Face model directory.
        weights: another LLM's `.model` of the same checkpoint, to share instead of loading a second copy (engines
        side by side with other knobs; one that quantizes copies them first).
        config: the flat knobs (dtype, device, max_model_len, seed, block_size, scheduler, ...), each mapped to
        its EngineConfig group by minillm/config/knobs.py."""
        self.config = EngineConfig.from_knobs(model, **config)
        self.engine = LLMEngine(self.config, model=weights)

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def model(self) -> torch.nn.Module:
        return self.engine.model

    def generate(self, prompts: str | list[str] | list[list[int]],
                 params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        """Run every prompt to completion; outputs come back in the order of the prompts.
        A prompt is text or a list of token ids; params is one SamplingParams or one per prompt.
        use_tqdm: a progress bar over the requests (tqdm's TQDM_DISABLE=1 turns every bar off; the
        test suite sets it)."""
        prompts, params = paired(prompts, params)
        ids = [self.engine.add_request(p, sp) for p, sp in zip(prompts, params)]
        done: dict[str, RequestOutput] = {}
        wanted = set(ids)  # the engine may be running other requests too (a stream, another caller)
        with tqdm(total=len(ids), desc="Generating", unit="req", **({} if use_tqdm else {"disable": True})) as bar:
            while len(done) < len(ids):
                for chunk in self.engine.step():
                    if chunk.request is not None and chunk.request_id in wanted:
                        done[chunk.request_id] = chunk.request
                        bar.update()
        return [done[i] for i in ids]

    def stream(self, prompt: str | list[int], params: SamplingParams | None = None) -> Iterator[StreamChunk]:
        """Yield the request's text as it is generated (chunk.index tells the samples apart when
        n > 1); each sample's last chunk has finished=True and its Completion in .output.
        Stopping the iteration early aborts the request and frees its blocks."""
        rid = self.engine.add_request(prompt, params)
        finished = False
        try:
            while not finished:
                for chunk in self.engine.step():
                    if chunk.request_id == rid:
                        finished = chunk.request is not None
                        yield chunk
        finally:
            if not finished:
                self.engine.abort(rid)

    @functools.cached_property
    def chat_template(self) -> ChatTemplate:
        """The model's chat template (its tokenizer_config.json's, else chat_template.DEFAULT_TEMPLATE)."""
        return ChatTemplate.for_model(self.engine.model_dir)

    def chat(self, messages: list[dict] | list[list[dict]],
             sampling_params: SamplingParams | list[SamplingParams] | None = None,
             use_tqdm: bool = True) -> list[RequestOutput]:
        """vLLM's LLM.chat: a conversation (a list of {"role", "content"} dicts) or a list of them, each
        rendered with the model's chat template up to where the assistant's answer begins, then
        generated as generate() does: -> one RequestOutput per conversation, its text the answer. An
        instruct model's answer ends at its end-of-turn token (its EOS), which the text leaves out.
        Malformed messages raise ValueError (chat_template.check_messages)."""
        many = isinstance(messages, list) and bool(messages) and isinstance(messages[0], list)
        prompts = [self.chat_template.render(m) for m in (messages if many else [messages])]
        return self.generate(prompts, sampling_params, use_tqdm)

    def stream_chat(self, messages: list[dict], sampling_params: SamplingParams | None = None) -> Iterator[StreamChunk]:
        """stream() on one conversation rendered as chat() renders it: the answer as it is generated."""
        return self.stream(self.chat_template.render(messages), sampling_params)

    def logits(self, token_ids: list[int] | torch.Tensor) -> torch.Tensor:
        """One full forward over a single sequence, no cache: -> float32 logits [len, vocab]."""
        return full_forward_logits(self.model, token_ids, self.engine.max_model_len, self.engine.device)
