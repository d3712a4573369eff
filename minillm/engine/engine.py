"""LLMEngine: the step loop. schedule -> run the model -> sample -> update sequences -> emit.

    engine = LLMEngine(EngineConfig(model="tiny"))
    engine.add_request("def fib(n):", SamplingParams(max_tokens=20))
    while engine.has_unfinished():
        for chunk in engine.step():
            print(chunk.text, end="")

Synchronous on purpose: every step is one visible, testable unit of work.
"""
import itertools
import time

import torch

from minillm.cache.contiguous import ContiguousCacheManager
from minillm.config import EngineConfig
from minillm.engine.runner import ModelRunner
from minillm.engine.scheduler import Scheduler
from minillm.engine.sequence import Sequence
from minillm.models.config import ModelConfig
from minillm.models.loader import load_model
from minillm.models.registry import resolve_model_path
from minillm.outputs import RequestOutput, StreamChunk
from minillm.sampling import SamplingParams, sample
from minillm.tokenizer import IncrementalDetokenizer, Tokenizer


class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.model_dir = resolve_model_path(config.model)
        self.device, self.dtype = config.torch_device, config.torch_dtype
        self.model = load_model(self.model_dir, self.dtype, self.device)
        self.model_config: ModelConfig = self.model.config
        self.tokenizer = Tokenizer(self.model_dir)
        limit = self.model_config.max_position_embeddings
        if config.max_model_len is not None and config.max_model_len > limit:
            raise ValueError(f"max_model_len {config.max_model_len} exceeds the model's "
                             f"max_position_embeddings ({limit})")
        self.max_model_len = config.max_model_len or limit
        self.eos_token_ids = self.tokenizer.eos_token_ids or self.model_config.eos_token_ids
        self.cache_manager = ContiguousCacheManager(self.model_config, self.dtype, self.device)
        self.scheduler = Scheduler(self.cache_manager)
        self.runner = ModelRunner(self.model, self.cache_manager, self.device)
        self._seed_rng = torch.Generator().manual_seed(config.seed)
        self._ids = itertools.count()

    # -- requests ---------------------------------------------------------------------------
    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None,
                    request_id: str | None = None) -> str:
        """Validate and queue a request; -> its id. Bad input raises ValueError, queue untouched."""
        params = params or SamplingParams()
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
        text, ids = self._prompt_ids(prompt)
        total = len(ids) + params.max_tokens
        if total > self.max_model_len:
            raise ValueError(f"prompt ({len(ids)} tokens) + max_tokens ({params.max_tokens}) = {total} "
                             f"exceeds the context length of {self.max_model_len} tokens")
        request_id = str(next(self._ids)) if request_id is None else request_id
        seed = params.seed if params.seed is not None else int(torch.randint(2**62, (1,), generator=self._seed_rng))
        generator = torch.Generator(device=self.device).manual_seed(seed)
        seq = Sequence(request_id, text, ids, params, generator,
                       IncrementalDetokenizer(self.tokenizer, ids), self.eos_token_ids)
        self.scheduler.add(seq)
        return request_id

    def _prompt_ids(self, prompt: str | list[int]) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("prompt is empty: give at least one character")
            return prompt, self.tokenizer.encode(prompt)
        ids = list(prompt)
        if not ids:
            raise ValueError("prompt_token_ids is empty: give at least one token")
        vocab = self.model_config.vocab_size
        bad = [t for t in ids if not isinstance(t, int) or not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt token ids must be integers in [0, {vocab}), got {bad[:5]}")
        return None, ids

    def abort(self, request_id: str) -> bool:
        """Stop a request now and free its cache; -> whether it was still queued or running."""
        return self.scheduler.abort(request_id) is not None

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    # -- the step ---------------------------------------------------------------------------
    def step(self) -> list[StreamChunk]:
        batch = self.scheduler.schedule(time.perf_counter())
        if not batch:
            return []
        logits = self.runner.execute(batch)  # [num_seqs, vocab]
        tokens = sample(logits, [b.seq.params for b in batch], [b.seq.generator for b in batch])
        now = time.perf_counter()
        return [self._update(b.seq, b.num_tokens, token, now) for b, token in zip(batch, tokens)]

    def _update(self, seq: Sequence, computed: int, token: int, now: float) -> StreamChunk:
        seq.num_computed_tokens += computed
        seq.token_ids.append(token)
        seq.metrics.token_times.append(now)
        seq.output_text += seq.detokenizer.push(token)
        if token in seq.stop_token_ids:
            seq.finish_reason = "stop"
        elif self._cut_at_stop_string(seq):
            seq.finish_reason = "stop"
        elif len(seq.output_token_ids) >= seq.params.max_tokens:
            seq.finish_reason = "length"
        if seq.finish_reason is not None:
            if seq.finish_reason == "length" or token in seq.stop_token_ids:
                seq.output_text += seq.detokenizer.flush()
                self._cut_at_stop_string(seq)
            seq.metrics.finished_time = now
            self.scheduler.finish(seq)
        return self._chunk(seq, [token])

    def _cut_at_stop_string(self, seq: Sequence) -> bool:
        """Cut the text before the first stop string, if one has appeared; -> whether one did."""
        hits = [i for i in (seq.output_text.find(s) for s in seq.params.stop) if i >= 0]
        if hits:
            seq.output_text = seq.output_text[:min(hits)]
        return bool(hits)

    def _chunk(self, seq: Sequence, token_ids: list[int]) -> StreamChunk:
        """Emit the text that is safe to show: while running, hold back a tail that could still
        turn out to be the start of a stop string."""
        end = len(seq.output_text)
        if not seq.is_finished and seq.params.stop:
            end -= max(len(s) for s in seq.params.stop) - 1
        delta = seq.output_text[seq.emitted_chars:max(end, seq.emitted_chars)]
        seq.emitted_chars += len(delta)
        output = self.output_of(seq) if seq.is_finished else None
        return StreamChunk(seq.request_id, delta, token_ids, seq.is_finished, output)

    def output_of(self, seq: Sequence) -> RequestOutput:
        return RequestOutput(seq.request_id, seq.prompt, seq.prompt_token_ids, seq.output_text,
                             seq.output_token_ids, seq.finish_reason, seq.metrics.as_dict())
