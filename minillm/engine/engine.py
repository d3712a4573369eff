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

from minillm.cache import make_cache_manager
from minillm.config import EngineConfig
from minillm.engine.runner import ModelRunner
from minillm.engine.scheduler import Scheduler
from minillm.engine.sequence import Sequence
from minillm.engine.telemetry import ScheduledWork, StepEvent
from minillm.models.config import ModelConfig
from minillm.models.loader import load_model
from minillm.models.registry import resolve_model_path
from minillm.outputs import Completion, RequestOutput, StreamChunk
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
        self.cache_manager = make_cache_manager(config, self.model_config, self.dtype, self.device)
        self.scheduler = Scheduler(config, self.cache_manager)
        self.runner = ModelRunner(self.model, self.cache_manager, self.device)
        self._seed_rng = torch.Generator().manual_seed(config.seed)
        self._finished: dict[str, list[Completion]] = {}  # per live request: its finished samples
        self._observers = []
        self.num_steps = 0
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
        if not self.cache_manager.fits(len(ids), total, params.n):
            raise ValueError(f"this request ({len(ids)} prompt tokens, max_tokens {params.max_tokens}, "
                             f"n {params.n}) could never fit in the KV pool of "
                             f"{self.cache_manager.blocks.num_blocks} blocks: raise num_kv_blocks or kv_cache_memory")
        request_id = str(next(self._ids)) if request_id is None else request_id
        seed = params.seed if params.seed is not None else int(torch.randint(2**62, (1,), generator=self._seed_rng))
        samples = []
        for i in range(params.n):
            generator = torch.Generator(device=self.device).manual_seed(seed + i)
            samples.append(Sequence(request_id, text, ids, params, generator,
                                    IncrementalDetokenizer(self.tokenizer, ids), self.eos_token_ids))
            samples[-1].index = i
        samples[0].forks = samples[1:]  # they join after the prompt's prefill, sharing its blocks
        self.scheduler.add(samples[0])
        self._finished[request_id] = []
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
        """Stop a request now and free its blocks; -> whether it was still queued or running."""
        self._finished.pop(request_id, None)
        return bool(self.scheduler.abort(request_id))

    def subscribe(self, observer) -> None:
        """Call observer(StepEvent) after every step (see engine/telemetry.py)."""
        self._observers.append(observer)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    # -- the step ---------------------------------------------------------------------------
    def step(self) -> list[StreamChunk]:
        start = time.perf_counter()
        batch = self.scheduler.schedule(start)
        if not batch:
            return []
        self.num_steps += 1
        phases = ["decode" if b.seq.num_computed_tokens >= b.seq.num_prompt_tokens and b.num_tokens == 1
                  else "prefill" for b in batch]  # a recomputed (preempted) sequence prefills too
        logits = self.runner.execute(batch)  # [num_seqs, vocab]
        # Only a sequence whose step reaches its last token samples; a prefill chunk that stops
        # short of the prompt's end just fills the cache.
        work = [(b.seq, b.num_tokens, row) for row, b in enumerate(batch)
                if b.seq.num_computed_tokens + b.num_tokens == len(b.seq)]
        for seq, n, row in list(work):
            if seq.forks:
                work += [(child, n, row) for child in self._fork(seq)]
        seqs = [seq for seq, _, _ in work]
        tokens = sample(logits[[row for _, _, row in work]], [s.params for s in seqs], [s.generator for s in seqs])
        now = time.perf_counter()
        for b in batch:
            if b.seq.num_computed_tokens + b.num_tokens < len(b.seq):
                b.seq.num_computed_tokens += b.num_tokens
                self.cache_manager.computed(b.seq)
        chunks = [self._update(seq, n, token, now) for (seq, n, _), token in zip(work, tokens)]
        if self._observers:
            self._emit(start, now, batch, phases, chunks)
        return chunks

    def _emit(self, start: float, end: float, batch, phases: list[str], chunks: list[StreamChunk]) -> None:
        scheduled = [ScheduledWork(b.seq.request_id, b.seq.index, b.num_tokens, phase)
                     for b, phase in zip(batch, phases)]
        event = StepEvent(self.num_steps, start, end - start, scheduled,
                          [c.request_id for c in chunks if c.request is not None],
                          len(self.scheduler.waiting), len(self.scheduler.running),
                          self.cache_manager.stats(self.scheduler.running), list(self.scheduler.preempted_now),
                          self.scheduler.num_preemptions, len(chunks))
        for observer in self._observers:
            observer(event)

    def _fork(self, parent: Sequence) -> list[Sequence]:
        """After the prompt's prefill, the request's other samples start from the same K/V (the
        same blocks, shared) and draw their first token from the same logits."""
        children, parent.forks = parent.forks, []
        for child in children:
            child.num_computed_tokens = parent.num_computed_tokens
            child.num_cached_prompt_tokens = parent.num_cached_prompt_tokens
            self.cache_manager.fork(parent, child)
            self.scheduler.start(child, parent.metrics.first_scheduled_time)
        return children

    def _update(self, seq: Sequence, computed: int, token: int, now: float) -> StreamChunk:
        seq.num_computed_tokens += computed
        self.cache_manager.computed(seq)
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
        chunk = StreamChunk(seq.request_id, seq.index, delta, token_ids, seq.is_finished)
        if seq.is_finished:
            chunk.output = self.completion_of(seq)
            done = self._finished[seq.request_id]
            done.append(chunk.output)
            if len(done) == seq.params.n:
                del self._finished[seq.request_id]
                chunk.request = RequestOutput(seq.request_id, seq.prompt, seq.prompt_token_ids,
                                              sorted(done, key=lambda c: c.index))
        return chunk

    def completion_of(self, seq: Sequence) -> Completion:
        metrics = {**seq.metrics.as_dict(), "cached_prompt_tokens": seq.num_cached_prompt_tokens}
        return Completion(seq.index, seq.output_text, seq.output_token_ids, seq.finish_reason, metrics)
