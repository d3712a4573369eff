"""LLMEngine: the step loop. schedule -> run the model -> sample -> update sequences -> emit.

    engine = LLMEngine(EngineConfig(model="tiny"))
    engine.add_request("def fib(n):", SamplingParams(max_tokens=20))
    while engine.has_unfinished():
        for chunk in engine.step():
            print(chunk.text, end="")

Synchronous on purpose: every step is one visible, testable unit of work. Observers (the
visualizer, benchmarks) read the engine through its StepEvents and the public methods below.
"""
import copy
import itertools
import time
from collections.abc import Callable
from dataclasses import fields
from typing import Any, NamedTuple

import torch

from minillm.cache import make_cache_manager
from minillm.config import Components, EngineConfig
from minillm.distributed.driver import TensorParallelDriver
from minillm.engine.runner import ModelRunner
from minillm.engine.scheduler import Scheduler
from minillm.models.config import ModelConfig
from minillm.models.loader import load_model
from minillm.models.registry import resolve_model_path
from minillm.outputs import Completion, RequestOutput, StreamChunk
from minillm.quant import QuantizedLinear, QuantOps, quantize_model
from minillm.quant.awq import apply_awq, calibration_rows
from minillm.quant.linear import int4_linear_triton
from minillm.sampling import SamplingParams, sample_requests, token_logprobs
from minillm.speculative.proposers import make_proposer
from minillm.speculative.speculator import Speculator
from minillm.state import (
    CacheKind,
    FinishReason,
    KVStats,
    Phase,
    ScheduledSeq,
    ScheduledWork,
    Sequence,
    SequenceSnapshot,
    StepEvent,
)
from minillm.structured import apply_grammar_mask
from minillm.structured.grammar import GrammarCompiler, new_bitmask
from minillm.tokenizer import IncrementalDetokenizer, Tokenizer
from minillm.utils import cdiv


def quant_ops(components: Components, attention_backend: str) -> QuantOps:
    """The codecs and int4 product quantized layers use: the components' where a lab replaces them,
    else the engine's (int4 on the fused Triton kernel with the Triton backend)."""
    parts = {f.name: getattr(components, f.name) for f in fields(QuantOps) if getattr(components, f.name)}
    if attention_backend == "triton":
        parts.setdefault("int4_linear", int4_linear_triton)
    return QuantOps(**parts)


def quantized(model: torch.nn.Module, config: EngineConfig, shared: bool, model_dir) -> torch.nn.Module:
    """model with quantized layers that use config's QuantOps: quantized as config.quantization says
    when it is set, or already quantized by its checkpoint. A model shared with other engines is
    copied before any change, never changed under them."""
    ops, already = quant_ops(config.components, config.attention_backend), getattr(model, "quant_config", None)
    if config.quantization is None:
        if already is None or ops == QuantOps():
            return model
        model = copy.deepcopy(model) if shared else model
        for layer in model.modules():
            if isinstance(layer, QuantizedLinear):
                layer.ops = ops
        return model
    if already is not None:
        raise ValueError(f"the model is already quantized ({already.label()}): load its "
                         f"full-precision checkpoint to quantize it another way")
    model = copy.deepcopy(model) if shared else model
    if config.quantization.calibration == "awq":
        apply_awq(model, config.quantization, calibration_rows(model_dir))
    return quantize_model(model, config.quantization, ops)


class PrefilledPrompt(NamedTuple):
    """A request whose prompt one engine computed, on its way to another that decodes it
    (LLMEngine.hand_off -> LLMEngine.add_prefilled; distributed/disagg.py moves it between processes)."""
    prompt_ids: list[int]
    first_tokens: list[int]                        # per sample: the token sampled after the prompt
    kv: Any                                        # the prompt's K/V, as the caller's pack returned them
    generator_states: list[torch.Tensor | None]    # per sample: its generator after that draw (None: it stopped)
    arrival_time: float                            # time.perf_counter() (one clock for every process of a host)
    first_scheduled_time: float | None


class EngineRequest(NamedTuple):
    """A request validated and ready to queue (LLMEngine.process_request -> LLMEngine.enqueue)."""
    request_id: str
    samples: list[Sequence]  # sample 0 first: the others fork from it after the prompt's prefill


class LLMEngine:
    def __init__(self, config: EngineConfig, model: torch.nn.Module | None = None) -> None:
        """model: weights already loaded from config.model (on config's device and dtype), to
        share one copy between engines with different knobs; None loads them."""
        self.config = config
        self.model_dir = resolve_model_path(config.model)
        self.device, self.dtype = config.torch_device, config.torch_dtype
        self.model = model if model is not None else load_model(self.model_dir, self.dtype, self.device)
        self.model = quantized(self.model, config, model is not None, self.model_dir)
        if config.tensor_parallel_size > 1:  # this process becomes rank 0, workers run the other shards (distributed/)
            self.model = TensorParallelDriver(self.model, self.model_dir, config)
        self.model_config: ModelConfig = self.model.config
        self.tokenizer = Tokenizer(self.model_dir)
        limit = self.model_config.max_position_embeddings
        if config.max_model_len is not None and config.max_model_len > limit:
            raise ValueError(f"max_model_len {config.max_model_len} exceeds the model's "
                             f"max_position_embeddings ({limit})")
        self.max_model_len = config.max_model_len or limit
        self.eos_token_ids = self.tokenizer.eos_token_ids or self.model_config.eos_token_ids
        self.cache = make_cache_manager(config, self.model_config, self.dtype, self.device)
        if config.tensor_parallel_size > 1:
            self.model.attach_pool(self.cache.pool)  # each worker's pool mirrors this one, for its kv heads
        self.scheduler = Scheduler(config, self.cache)
        self.runner = ModelRunner(self.model, self.cache, self.device, config.profile_attention, config.compile_decode)
        self.speculator = None
        if config.speculative is not None:
            proposer = make_proposer(config.speculative, self, config.components)
            self.speculator = Speculator(config.speculative, proposer, self.max_model_len, config.components)
            self.scheduler.on_release.append(proposer.release)
        self._sample = config.components.sample
        self._grammar_mask = config.components.grammar_mask or apply_grammar_mask
        self._grammars: GrammarCompiler | None = None  # built at the first structured request
        self._seed_rng = torch.Generator().manual_seed(config.seed)
        self._finished: dict[str, list[Completion]] = {}  # per live request: its finished samples
        self._observers = []
        self.last_step_timings: dict[str, float] = {}  # seconds per phase of the latest step (see step())
        self.num_steps = 0
        self._ids = itertools.count()

    # -- requests ---------------------------------------------------------------------------
    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None,
                    request_id: str | None = None) -> str:
        """Validate and queue a request; -> its id. Bad input raises ValueError, queue untouched."""
        return self.enqueue(self.process_request(prompt, params, request_id))

    def process_request(self, prompt: str | list[int], params: SamplingParams | None = None,
                        request_id: str | None = None) -> EngineRequest:
        """Validate, tokenize, compile the grammar and build the samples, touching no queue (so any
        thread may call it while a step runs). Bad input raises ValueError (TypeError for params)."""
        params = params or SamplingParams()
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
        text, ids = self._prompt_ids(prompt)
        total = len(ids) + params.max_tokens
        if total > self.max_model_len:
            raise ValueError(f"prompt ({len(ids)} tokens) + max_tokens ({params.max_tokens}) = {total} "
                             f"exceeds the context length of {self.max_model_len} tokens")
        if not self.cache.fits(len(ids), total, params.n):
            raise ValueError(f"this request ({len(ids)} prompt tokens, max_tokens {params.max_tokens}, "
                             f"n {params.n}) could never fit in the KV pool of {self.cache.num_blocks} "
                             f"blocks: raise num_kv_blocks or kv_cache_memory")
        request_id = str(next(self._ids)) if request_id is None else request_id
        self._check_id_free(request_id)
        grammars = [self._grammar_state(params) for _ in range(params.n)]
        seed = params.seed if params.seed is not None else int(torch.randint(2**62, (1,), generator=self._seed_rng))
        samples = [Sequence(request_id, text, ids, params, torch.Generator(device=self.device).manual_seed(seed + i),
                            IncrementalDetokenizer(self.tokenizer, ids), self.eos_token_ids, index=i)
                   for i in range(params.n)]
        for seq, grammar in zip(samples, grammars):
            seq.grammar = grammar
        samples[0].forks = samples[1:]  # they join after the prompt's prefill, sharing its blocks
        return EngineRequest(request_id, samples)

    def enqueue(self, request: EngineRequest) -> str:
        """Queue a processed request (only the thread that steps may); -> its id. ValueError if
        the id got taken since it was processed."""
        self._check_id_free(request.request_id)
        self.scheduler.add(request.samples[0])
        self._finished[request.request_id] = []
        return request.request_id

    def _check_id_free(self, request_id: str) -> None:
        if request_id in self._finished:
            raise ValueError(f"request id {request_id!r} is already in use")

    def _grammar_state(self, params: SamplingParams):
        """A new matcher for a structured request (None for a free one); a bad spec raises ValueError."""
        if params.structured is None:
            return None
        if self.speculator is not None:
            raise ValueError("structured output is not supported with speculative decoding: the proposals "
                             "would have to be masked too. Use an engine without `speculative`")
        if self._grammars is None:
            self._grammars = GrammarCompiler(self.model_dir, self.model_config.vocab_size, self.eos_token_ids)
        return self._grammars.matcher(params.structured)

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

    # -- KV offload (cache/offload.py): a second tier for the blocks of agents waiting on tools --
    def attach_offload(self, kind: str, capacity: int, directory: str | None = None) -> None:
        """Give the pool a second tier of `capacity` blocks, "host" (CPU memory) or "disk" (a file
        in `directory`): prompts restore their prefix from it, evicted cached blocks go to it."""
        self._offload_cache().attach_offload(kind, capacity, directory)

    def offload_prefix(self, token_ids: list[int]) -> int:
        """Move the pool's cached blocks of this prefix to the tier (an agent waiting on a tool):
        its next call restores them. -> blocks freed in the pool."""
        return self._offload_cache().offload_prefix(token_ids)

    def offload_stats(self) -> dict | None:
        """The tier's blocks, bytes, offloads, restores, misses and seconds moving; None without one."""
        return self._offload_cache().offload_stats()

    def _offload_cache(self):
        if not hasattr(self.cache, "offload_prefix"):
            raise ValueError(f"KV offload needs kv_cache='paged', got {self.config.kv_cache.value!r}")
        return self.cache

    # -- disaggregated serving (distributed/disagg.py): one engine prefills, another decodes ----------
    def hand_off(self, request_id: str, pack: Callable) -> PrefilledPrompt:
        """Give away a request whose prompt was computed in the latest step (its samples have
        their first tokens) so that another engine decodes it: pack(pool, blocks, num_prompt_tokens)
        copies its prompt's K/V out of this pool, then the request leaves this engine (its blocks
        go back; with prefix caching, its full ones stay cached for later prompts)."""
        samples = [s for s in self.scheduler.running if s.request_id == request_id]
        if not samples or any(len(s.token_ids) != s.num_prompt_tokens + 1 or not s.is_decoding for s in samples):
            raise ValueError(f"request {request_id!r} is not a prompt just computed, with its first token and "
                             f"nothing else: {samples or 'it is not running'}")
        if self.config.kv_cache != CacheKind.PAGED or self.speculator is not None or samples[0].logprobs is not None:
            raise ValueError("hand_off moves paged blocks and tokens only: it needs kv_cache='paged', no speculative "
                             "decoding and no logprobs")
        head, done = samples[0], {c.index: c for c in self._finished[request_id]}  # done: stopped at their first token
        by_index = {s.index: s for s in samples}
        kv = pack(self.cache.pool, self.cache.block_table(head), head.num_prompt_tokens)
        prefilled = PrefilledPrompt(
            head.prompt_token_ids, [by_index[i].token_ids[-1] if i in by_index else done[i].token_ids[0]
                                    for i in range(head.params.n)], kv,
            [by_index[i].generator.get_state() if i in by_index else None for i in range(head.params.n)],
            head.metrics.arrival_time, head.metrics.first_scheduled_time)
        self.abort(request_id)
        return prefilled

    def add_prefilled(self, prefilled: PrefilledPrompt, params: SamplingParams, request_id: str, unpack: Callable,
                      prompt: str | None = None) -> list[StreamChunk] | None:
        """Admit a request whose prompt another engine computed (hand_off there): fresh blocks that
        unpack(kv, pool, blocks) fills with the prompt's K/V (kv: [2, layers, prompt tokens, kv_heads,
        head_dim]), the prompt counted as computed, then each sample appends its first token as if it
        had sampled it here (its generator continues from the state the other engine left).
        -> the first tokens' chunks; None when it cannot start now (max_num_seqs reached, sequences
        waiting ahead of it, or no free blocks): nothing changed, offer it again later."""
        if self.config.kv_cache != CacheKind.PAGED or self.speculator is not None or params.logprobs is not None:
            raise ValueError("add_prefilled takes paged blocks and tokens only: it needs kv_cache='paged', no "
                             "speculative decoding and no logprobs")
        if len(prefilled.first_tokens) != params.n:
            raise ValueError(f"got {len(prefilled.first_tokens)} first tokens for n = {params.n} samples")
        if self.scheduler.waiting or len(self.scheduler.running) >= self.scheduler.max_num_seqs:
            return None
        self.add_request(prefilled.prompt_ids, params, request_id)
        head = self.scheduler.waiting[-1]
        if not self.scheduler.admit(head):
            self.abort(request_id)
            return None
        cached, bs = head.num_computed_tokens, self.cache.block_size  # prefix-cache hits hold their K/V already
        unpack(prefilled.kv[:, :, cached:], self.cache.pool,
               self.cache.block_table(head)[cached // bs:cdiv(len(prefilled.prompt_ids), bs)])
        for seq in [head, *head.forks]:
            seq.prompt = prompt
            seq.metrics.arrival_time = prefilled.arrival_time
            seq.metrics.first_scheduled_time = prefilled.first_scheduled_time
        computed = ScheduledSeq(head, len(prefilled.prompt_ids) - cached, Phase.PREFILL, samples=True)
        emitting = self.scheduler.advance([computed])  # the sample and its forks, in index order
        now, chunks = time.perf_counter(), []
        for (seq, _), token, state in zip(emitting, prefilled.first_tokens, prefilled.generator_states):
            if state is not None:
                seq.generator.set_state(state)
            chunks.append(self._append(seq, [token], now))
        return chunks

    # -- what observers may read ------------------------------------------------------------
    def subscribe(self, observer) -> None:
        """Call observer(StepEvent) after every step."""
        self._observers.append(observer)

    def unsubscribe(self, observer) -> None:
        self._observers.remove(observer)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_preemptions(self) -> int:
        return self.scheduler.num_preemptions

    def kv_stats(self) -> KVStats:
        """The KV pool now: blocks used, cached and free, bytes, fragmentation, prefix hits."""
        return self.cache.stats(self.scheduler.running)

    def sequences(self) -> list[SequenceSnapshot]:
        """Every live sample now: running ones in admission order, then the waiting queue."""
        return [SequenceSnapshot(
            request_id=s.request_id, index=s.index, status=s.status, num_prompt_tokens=s.num_prompt_tokens,
            num_computed_tokens=s.num_computed_tokens, num_cached_prompt_tokens=s.num_cached_prompt_tokens,
            num_output_tokens=len(s.token_ids) - s.num_prompt_tokens, num_preemptions=s.num_preemptions,
            block_table=tuple(self.cache.block_table(s)), arrival_time=s.metrics.arrival_time)
            for s in [*self.scheduler.running, *self.scheduler.waiting]]

    # -- the step ---------------------------------------------------------------------------
    def step(self) -> list[StreamChunk]:
        """One step: schedule, run the model, sample, update the sequences, tell the observers.
        Its phases are timed into last_step_timings (and StepEvent.timings): schedule, prepare (the
        step's tensors), model (the forward and the logits; attention is part of it, and timed
        too with EngineConfig(profile_attention=True)), sample, update (append tokens, detokenize,
        check stops), telemetry (build the event and call the observers)."""
        start = time.perf_counter()
        if self.speculator is not None:
            self.speculator.propose(self.scheduler.running)
        batch = self.scheduler.schedule(start)
        if not batch:
            return []
        self.num_steps += 1
        scheduled = time.perf_counter()
        logits = self.runner.execute(batch)  # [rows, vocab]: each item's num_logits rows, in batch order
        executed = time.perf_counter()
        offsets = list(itertools.accumulate((b.num_logits for b in batch), initial=0))
        accepted, verified, verifications = None, {}, []
        if self.speculator is not None:
            accepted, verified, verifications = self.speculator.verify(batch, logits, self.runner.last_hidden, offsets)
        emitting = self.scheduler.advance(batch, accepted)  # [(seq, batch index)]
        drawn = [(seq, i) for seq, i in emitting if not (i in verified and seq is batch[i].seq)]
        rows = self._constrain(logits[[offsets[i] for _, i in drawn]], [seq for seq, _ in drawn])
        tokens = sample_requests(rows, [s.params for s, _ in drawn], [s.generator for s, _ in drawn], self._sample)
        emitted = [(seq, [token], offsets[i]) for (seq, i), token in zip(drawn, tokens)]
        emitted += [(batch[i].seq, verified[i], offsets[i]) for i in verified]
        for seq, new, row in emitted:
            if seq.logprobs is not None:
                seq.logprobs += [token_logprobs(logits[row + j], t, seq.params.logprobs) for j, t in enumerate(new)]
        if self.speculator is not None:  # the hidden states the next proposals start from
            for seq, i in drawn:
                self.speculator.observe(seq, self.runner.last_hidden[offsets[i]])
        now = time.perf_counter()
        chunks = [self._append(seq, new, now) for seq, new, _ in emitted]
        updated = time.perf_counter()
        self.last_step_timings = {"schedule": scheduled - start, **self.runner.last_timings,
                                  "sample": now - executed, "update": updated - now}
        if self._observers:
            self._emit(start, now, batch, chunks, verifications)
        self.last_step_timings["telemetry"] = time.perf_counter() - updated
        return chunks

    def _constrain(self, rows: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        """Mask the rows of structured samples to the tokens their grammar allows next.
        rows: [len(seqs), vocab] -> [len(seqs), vocab]"""
        constrained = [j for j, seq in enumerate(seqs) if seq.grammar is not None]
        if not constrained:
            return rows
        bitmask = new_bitmask(len(constrained), rows.shape[-1])  # [constrained, ceil(vocab / 32)]
        for r, j in enumerate(constrained):
            seqs[j].grammar.fill_bitmask(bitmask, r)
        rows = rows.clone()
        rows[constrained] = self._grammar_mask(rows[constrained], bitmask.to(rows.device))
        return rows

    def _emit(self, start: float, end: float, batch: list[ScheduledSeq], chunks: list[StreamChunk],
              verifications: list) -> None:
        event = StepEvent(
            step=self.num_steps, start=start, duration=end - start,
            scheduled=[ScheduledWork(b.seq.request_id, b.seq.index, b.num_tokens, b.phase) for b in batch],
            finished=[c.request_id for c in chunks if c.request is not None],
            waiting=self.num_waiting, running=self.num_running, kv=self.kv_stats(), sequences=self.sequences(),
            preempted=list(self.scheduler.preempted_now), num_preemptions=self.num_preemptions,
            output_tokens=sum(len(c.token_ids) for c in chunks), timings=dict(self.last_step_timings),
            verifications=verifications)
        for observer in self._observers:
            observer(event)

    def _append(self, seq: Sequence, tokens: list[int], now: float) -> StreamChunk:
        """Add a step's tokens to their sequence (one, or several when speculating), detokenize
        them, and finish the sequence at the first that stops it (the rest are dropped)."""
        for n, token in enumerate(tokens, 1):
            seq.token_ids.append(token)
            seq.metrics.token_times.append(now)
            seq.output_text += seq.detokenizer.push(token)
            if seq.grammar is not None:
                seq.grammar.accept(token)
            reason = None
            if token in seq.stop_token_ids or self._cut_at_stop_string(seq) or (seq.grammar and seq.grammar.finished):
                reason = FinishReason.STOP
            elif len(seq.token_ids) - seq.num_prompt_tokens >= seq.params.max_tokens:
                reason = FinishReason.LENGTH
            if reason is not None:
                if reason == FinishReason.LENGTH or token in seq.stop_token_ids:
                    seq.output_text += seq.detokenizer.flush()
                    self._cut_at_stop_string(seq)
                seq.metrics.finished_time = now
                self.scheduler.finish(seq, reason)
                if seq.logprobs is not None:
                    del seq.logprobs[len(seq.output_token_ids):]
                return self._chunk(seq, tokens[:n])
        return self._chunk(seq, tokens)

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
        chunk = StreamChunk(seq.request_id, seq.index, delta, token_ids, seq.is_finished,
                            logprobs=None if seq.logprobs is None else seq.logprobs[-len(token_ids):])
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
        if self.speculator is not None:
            metrics.update(spec_proposed=seq.num_proposed, spec_accepted=seq.num_accepted)
        return Completion(seq.index, seq.output_text, seq.output_token_ids, seq.finish_reason, metrics,
                          None if seq.logprobs is None else list(seq.logprobs))
