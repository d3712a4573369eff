"""The input processor: a request as the caller gives it -> an EngineRequest the scheduler can take.

It validates the prompt and the params (every refusal is a ValueError that names the value and
what is accepted), tokenizes, compiles a structured request's grammar into a matcher per sample,
draws the seed and builds the request's n Sequences. It reads only what never changes while the
engine runs (the tokenizer, the model's limits, the pool's size), so another thread may process a
request while a step runs: the engine thread then queues it (LLMEngine.enqueue).
"""
import itertools
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

from minillm.cache.base import CacheManager
from minillm.config import EngineConfig
from minillm.engine.scheduler import Scheduler
from minillm.sampling import SamplingParams
from minillm.sequence import EngineRequest, Sequence
from minillm.structured.grammar import GrammarCompiler, GrammarLimits, GrammarState
from minillm.tokenizer import IncrementalDetokenizer, Tokenizer


@dataclass(frozen=True)
class ServedModel:
    """The loaded model as a request meets it: fixed once the engine is built."""
    model_dir: Path                 # its files: the grammar compiler reads the tokenizer's vocabulary there
    tokenizer: Tokenizer
    vocab_size: int
    eos_token_ids: tuple[int, ...]  # what stops a sample unless ignore_eos
    max_model_len: int              # prompt + max_tokens may not exceed it


class InputProcessor:
    """Turns a prompt and its SamplingParams into an EngineRequest: validated, tokenized, its grammar
    compiled and its seed drawn, with one Sequence per sample. Touches no queue."""
    def __init__(self, config: EngineConfig, model: ServedModel, cache: CacheManager, scheduler: Scheduler) -> None:
        """cache: read for its size only (cache.fits), never changed here. scheduler: read for its
        max_num_seqs only (a request's n samples run at once, so n above it could never be admitted)."""
        self.max_num_seqs = scheduler.max_num_seqs
        self.tokenizer, self.model_dir, self.vocab_size = model.tokenizer, model.model_dir, model.vocab_size
        self.eos_token_ids, self.max_model_len, self.cache = model.eos_token_ids, model.max_model_len, cache
        self.device, self.speculative = config.torch_device, config.speculative is not None
        self._grammars: GrammarCompiler | None = None  # built at the first structured request
        self.grammar_limits = GrammarLimits()  # the server sets its flags' limits before it serves
        self._seed_rng = torch.Generator().manual_seed(config.seed)
        self._ids = itertools.count()
        self._lock = threading.Lock()  # the counters and the compiler, for callers on several threads

    def process(self, prompt: str | list[int], params: SamplingParams | None = None,
                request_id: str | None = None) -> EngineRequest:
        """-> the request, validated and built, not queued. Bad input raises ValueError (TypeError
        for params that are not a SamplingParams)."""
        params = params or SamplingParams()
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
        text, ids = self.prompt_ids(prompt)
        self._check_fits(len(ids), params)
        self._check_logit_bias(params)
        with self._lock:
            request_id = str(next(self._ids)) if request_id is None else request_id
        grammars = [self._grammar_state(params) for _ in range(params.n)]
        with self._lock:
            seed = params.seed if params.seed is not None else int(torch.randint(2**62, (1,), generator=self._seed_rng))
        samples = [Sequence(request_id, text, ids, params, torch.Generator(device=self.device).manual_seed(seed + i),
                            IncrementalDetokenizer(self.tokenizer, ids), self.eos_token_ids, index=i)
                   for i in range(params.n)]
        for seq, grammar in zip(samples, grammars):
            seq.grammar = grammar
        samples[0].forks = samples[1:]  # they join after the prompt's prefill, sharing its blocks
        return EngineRequest(request_id, text, ids, params, samples)

    def prompt_ids(self, prompt: str | list[int]) -> tuple[str | None, list[int]]:
        """-> (its text or None, its token ids), checked: an empty prompt, an id outside the vocabulary
        raise ValueError. It reads nothing that changes, so any thread may call it."""
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("prompt is empty: give at least one character")
            return prompt, self.tokenizer.encode(prompt)
        ids = list(prompt)
        if not ids:
            raise ValueError("prompt_token_ids is empty: give at least one token")
        bad = [t for t in ids if not isinstance(t, int) or not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"prompt token ids must be integers in [0, {self.vocab_size}), got {bad[:5]}")
        return None, ids

    def max_new_tokens(self, num_prompt_tokens: int, n: int = 1) -> int:
        """The largest max_tokens a request of n samples after this prompt could have: what the context
        leaves, and what the empty KV pool could hold (0: not even one token). A default of this size is
        always servable, where "the rest of the context" may not be (a pool smaller than the context)."""
        least, most = 0, max(0, self.max_model_len - num_prompt_tokens)
        while least < most:  # bisect: a request that fits still fits with fewer tokens
            mid = (least + most + 1) // 2
            if self.cache.fits(num_prompt_tokens, num_prompt_tokens + mid, n):
                least = mid
            else:
                most = mid - 1
        return least

    def _check_fits(self, num_prompt_tokens: int, params: SamplingParams) -> None:
        """The request fits the context, and could fit in the empty KV pool."""
        if params.n > self.max_num_seqs:
            raise ValueError(f"n ({params.n}) exceeds max_num_seqs ({self.max_num_seqs}): a request's samples "
                             f"run together, so at most {self.max_num_seqs} per request here")
        total = num_prompt_tokens + params.max_tokens
        if total > self.max_model_len:
            raise ValueError(f"prompt ({num_prompt_tokens} tokens) + max_tokens ({params.max_tokens}) = {total} "
                             f"exceeds the context length of {self.max_model_len} tokens")
        if not self.cache.fits(num_prompt_tokens, total, params.n):
            raise ValueError(f"this request ({num_prompt_tokens} prompt tokens, max_tokens {params.max_tokens}, "
                             f"n {params.n}) could never fit in the KV pool of {self.cache.num_blocks} "
                             f"blocks: raise num_kv_blocks or kv_cache_memory")

    def _check_logit_bias(self, params: SamplingParams) -> None:
        """Every biased token is one of the model's (SamplingParams checked the rest, but not the vocabulary)."""
        bad = sorted(t for t in params.logit_bias or () if t >= self.vocab_size)
        if bad:
            raise ValueError(f"logit_bias names token id {bad[0]}{' (and more)' if len(bad) > 1 else ''}, "
                             f"outside the vocabulary: token ids are 0 to {self.vocab_size - 1}")

    def _grammar_state(self, params: SamplingParams) -> GrammarState | None:
        """A new matcher for a structured request (None for a free one); a bad spec raises ValueError."""
        if params.structured is None:
            return None
        if self.speculative:
            raise ValueError("structured output is not supported with speculative decoding: the proposals "
                             "would have to be masked too. Use an engine without `speculative`")
        with self._lock:  # only to build the compiler: a compile under it would hold up every request
            if self._grammars is None:
                self._grammars = GrammarCompiler(self.model_dir, self.vocab_size, self.eos_token_ids,
                                                 self.grammar_limits)
        return self._grammars.matcher(params.structured)
