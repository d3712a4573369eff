"""LLMEngine: the engine core's step loop, and the engine's public face.

    engine = LLMEngine(EngineConfig(model="tiny"))
    engine.add_request("def fib(n):", SamplingParams(max_tokens=20))
    while engine.has_unfinished():
        for chunk in engine.step():
            print(chunk.text, end="")

Three parts, as in vLLM V1. The input processor (input_processor.py) turns a prompt into an
EngineRequest. The core, step() below, schedules (scheduler.py), runs the model (runner.py), lets
its decoding strategy verify proposals (decoding.py: plain, or speculative), samples (sampler.py)
and advances the sequences. The output processor (output_processor.py) turns the tokens into
text, stops and outputs. The model itself is set up by model_setup.py.

Synchronous on purpose: every step is one visible, testable unit of work. Observers (the
visualizer, benchmarks) read the engine through its StepEvents and the public methods below.
"""
import functools
import time
from collections.abc import Callable

import torch

from minillm.arith import cdiv
from minillm.cache import make_cache_manager
from minillm.config import CacheKind, EngineConfig
from minillm.engine.decoding import Decoding, PlainDecoding
from minillm.engine.input_processor import InputProcessor
from minillm.engine.model_setup import setup_model
from minillm.engine.output_processor import OutputProcessor
from minillm.engine.runner import ModelRunner
from minillm.engine.sampler import Sampler, first_rows
from minillm.engine.scheduler import Scheduler
from minillm.models.model_config import ModelConfig
from minillm.models.registry import resolve_model_path
from minillm.outputs import Completion, StreamChunk
from minillm.sampling import SamplingParams
from minillm.sequence import EngineRequest, PrefilledPrompt, Sequence
from minillm.speculative.proposers import make_proposer
from minillm.speculative.speculator import Speculator
from minillm.speculative.target import ProposerTarget
from minillm.step import KVStats, ScheduledSeq, ScheduledWork, SequenceSnapshot, StepEvent, Verification
from minillm.tokenizer import Tokenizer
from minillm.tp.driver import TensorParallelDriver


class LLMEngine:
    """The engine: requests in (add_request), one step at a time (step), chunks out. It owns the input
    processor, the scheduler, the cache, the model runner, the decoding strategy, the sampler and the output
    processor, and tells its observers (subscribe) a StepEvent after every step."""
    def __init__(self, config: EngineConfig, model: torch.nn.Module | None = None) -> None:
        """model: weights already loaded from config.model (on config's device and dtype), to
        share one copy between engines with different knobs; None loads them."""
        self.config = config
        self.model_dir = resolve_model_path(config.model)
        self.device, self.dtype = config.torch_device, config.torch_dtype
        self.model = setup_model(config, self.model_dir, model)
        self.model_config: ModelConfig = self.model.config
        self.tokenizer = Tokenizer(self.model_dir)
        limit = self.model_config.max_position_embeddings
        if config.max_model_len is not None and config.max_model_len > limit:
            raise ValueError(f"max_model_len {config.max_model_len} exceeds the model's "
                             f"max_position_embeddings ({limit})")
        self.max_model_len = config.max_model_len or limit
        self.eos_token_ids = self.tokenizer.eos_token_ids or self.model_config.eos_token_ids
        self.cache = make_cache_manager(config, self.model_config, self.dtype, self.device)
        if isinstance(self.model, TensorParallelDriver):
            self.model.attach_pool(self.cache.pool)  # each worker's pool mirrors this one, for its kv heads
        self.scheduler = Scheduler(config.scheduler, self.cache, config.components)
        self.runner = ModelRunner(self.model, self.cache, self.device, config.kernels.profile_attention,
                                  config.kernels.compile_decode)
        self.speculator = None if config.speculative is None else self._speculator()
        self.decoding: Decoding = self.speculator or PlainDecoding()
        speculative = config.speculative is not None
        self.input_processor = InputProcessor(self.tokenizer, self.model_dir, self.model_config.vocab_size,
                                              self.eos_token_ids, self.max_model_len, self.cache, self.device,
                                              config.seed, speculative, self.scheduler.max_num_seqs)
        self.sampler = Sampler(config.components)
        self.output_processor = OutputProcessor(self.scheduler.finish, speculative)
        self._observers = []
        self.last_step_timings: dict[str, float] = {}  # seconds per phase of the latest step (see _record)
        self.num_steps = 0

    def _speculator(self) -> Speculator:
        """Speculative decoding's strategy. Its proposer sees the target only as a ProposerTarget: a
        draft model gets a pool as large as the target's, and runs on the engine's own ModelRunner."""
        spec, slots = self.config.speculative, (self.cache.num_blocks or 4096) * self.config.cache.block_size
        target = ProposerTarget(self.model, self.model_dir, self.tokenizer, self.device, self.dtype, slots,
                                functools.partial(ModelRunner, device=self.device), self.cache)
        proposer = make_proposer(spec, target, self.config.components)
        self.scheduler.on_release.append(proposer.release)
        return Speculator(spec, proposer, self.max_model_len, self.config.components)

    # -- requests ---------------------------------------------------------------------------
    def process_request(self, prompt: str | list[int], params: SamplingParams | None = None,
                        request_id: str | None = None) -> EngineRequest:
        """Validate, tokenize, compile the grammar, draw the seed and build the samples: -> the
        request, not queued. It touches no queue, so another thread may call it while a step runs.
        Bad input raises ValueError (TypeError for params that are not a SamplingParams)."""
        return self.input_processor.process(prompt, params, request_id)

    def enqueue(self, request: EngineRequest) -> str:
        """Queue a processed request (only the thread that steps may); -> its id. An id still in
        use raises ValueError, queue untouched."""
        self.output_processor.track(request.request_id)
        self.scheduler.add(request.samples[0])
        return request.request_id

    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None,
                    request_id: str | None = None) -> str:
        """Validate and queue a request; -> its id. Bad input raises ValueError, queue untouched."""
        return self.enqueue(self.process_request(prompt, params, request_id))

    def abort(self, request_id: str) -> bool:
        """Stop a request now and free its blocks; -> whether it was still queued or running."""
        self.output_processor.forget(request_id)
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
            raise ValueError(f"KV offload needs kv_cache='paged', got {self.config.cache.kind.value!r}")
        return self.cache

    # -- disaggregated serving (disagg/disaggregated_llm.py): one engine prefills, another decodes ----------
    def hand_off(self, request_id: str, pack: Callable) -> PrefilledPrompt:
        """Give away a request whose prompt was computed in the latest step (its samples have
        their first tokens) so that another engine decodes it: pack(pool, blocks, num_prompt_tokens)
        copies its prompt's K/V out of this pool, then the request leaves this engine (its blocks
        go back; with prefix caching, its full ones stay cached for later prompts)."""
        samples = [s for s in self.scheduler.running if s.request_id == request_id]
        if not samples or any(len(s.token_ids) != s.num_prompt_tokens + 1 or not s.is_decoding for s in samples):
            raise ValueError(f"request {request_id!r} is not a prompt just computed, with its first token and "
                             f"nothing else: {samples or 'it is not running'}")
        self._check_handoff("hand_off moves", samples[0].params)
        head, by_index = samples[0], {s.index: s for s in samples}
        done = {c.index: c for c in self.output_processor.finished_samples(request_id)}  # stopped at their first token
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
        -> the first tokens' chunks; None when the scheduler cannot start it now (max_num_seqs
        reached, sequences waiting ahead of it, or no free blocks): nothing changed, offer it again later."""
        self._check_handoff("add_prefilled takes", params)
        if len(prefilled.first_tokens) != params.n:
            raise ValueError(f"got {len(prefilled.first_tokens)} first tokens for n = {params.n} samples")
        request = self.process_request(prefilled.prompt_ids, params, request_id)
        for seq in request.samples:  # it arrived at the other engine: its clock and its text come with it
            seq.prompt, seq.metrics.arrival_time = prompt, prefilled.arrival_time

        def fill(head: Sequence) -> None:  # the prefix cache's hits hold their K/V already
            cached, bs = head.num_computed_tokens, self.cache.block_size
            unpack(prefilled.kv[:, :, cached:], self.cache.pool,
                   self.cache.block_table(head)[cached // bs:cdiv(len(prefilled.prompt_ids), bs)])

        self.output_processor.track(request_id)
        samples = self.scheduler.admit_prefilled(request.samples[0], prefilled.first_scheduled_time, fill)
        if samples is None:
            self.output_processor.forget(request_id)
            return None
        now, chunks = time.perf_counter(), []
        for seq, token, state in zip(samples, prefilled.first_tokens, prefilled.generator_states):
            if state is not None:
                seq.generator.set_state(state)
            chunks.append(self.output_processor.append(seq, [token], now))
        return chunks

    def _check_handoff(self, what: str, params: SamplingParams) -> None:
        config = self.config
        if config.cache.kind != CacheKind.PAGED or config.speculative is not None or params.logprobs is not None:
            raise ValueError(f"{what} paged blocks and tokens only: it needs kv_cache='paged', no speculative "
                             f"decoding and no logprobs")

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
    def num_waiting_seqs(self) -> int:
        """Sequences queued: a waiting request's samples fork once it runs, so it counts n."""
        return sum(1 + len(s.forks) for s in self.scheduler.waiting)

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_preemptions(self) -> int:
        return self.scheduler.num_preemptions

    @property
    def uses_cpu_decode_kernel(self) -> bool:
        """Whether decode rows attend through the C++ paged kernel (kernels/paged_decode_cpu.py) this run."""
        return bool(getattr(self.cache, "cpu_decode", False))

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

    def completion_of(self, seq: Sequence) -> Completion:
        return self.output_processor.completion_of(seq)

    # -- the core ---------------------------------------------------------------------------
    def step(self) -> list[StreamChunk]:
        """One step: propose, schedule, run the model, verify and sample, advance, append the
        tokens (the output processor), tell the observers. Its phases: last_step_timings."""
        start = time.perf_counter()
        self.decoding.propose(self.scheduler.running)
        batch = self.scheduler.schedule(start)
        if not batch:
            return []
        self.num_steps += 1
        scheduled = time.perf_counter()
        logits = self.runner.execute(batch)  # [rows, vocab]: each item's num_logits rows, in batch order
        executed, rows = time.perf_counter(), first_rows(batch)
        verdict = self.decoding.verify(batch, logits, rows)
        emitting = self.scheduler.advance(batch, verdict.accepted)  # [(seq, batch index)]: who emits now
        emitted = self.sampler.emit(emitting, logits, rows, verdict.tokens)  # [(seq, its new tokens, first row)]
        self.decoding.observe(emitted, self.runner.last_hidden)
        now = time.perf_counter()
        chunks = [self.output_processor.append(seq, tokens, now) for seq, tokens, _ in emitted]
        self._record(batch, chunks, verdict.records, (start, scheduled, executed, now))
        return chunks

    def _record(self, batch: list[ScheduledSeq], chunks: list[StreamChunk], verifications: list[Verification],
                marks: tuple[float, float, float, float]) -> None:
        """Time the step's phases into last_step_timings (and StepEvent.timings): schedule, prepare
        (the step's tensors), model (the forward and the logits; attention is part of it, and timed
        too with EngineConfig.from_knobs(profile_attention=True)), sample (verify, sample, observe), update
        (append tokens, detokenize, check stops), telemetry (build the event, call the observers)."""
        start, scheduled, executed, now = marks
        updated = time.perf_counter()
        self.last_step_timings = {"schedule": scheduled - start, **self.runner.last_timings,
                                  "sample": now - executed, "update": updated - now}
        if self._observers:
            event = StepEvent(
                step=self.num_steps, start=start, duration=now - start,
                scheduled=[ScheduledWork(b.seq.request_id, b.seq.index, b.num_tokens, b.phase) for b in batch],
                finished=[c.request_id for c in chunks if c.request is not None],
                waiting=self.num_waiting, running=self.num_running, kv=self.kv_stats(), sequences=self.sequences(),
                preempted=list(self.scheduler.preempted_now), num_preemptions=self.num_preemptions,
                output_tokens=sum(len(c.token_ids) for c in chunks), timings=dict(self.last_step_timings),
                verifications=verifications)
            for observer in self._observers:
                observer(event)
        self.last_step_timings["telemetry"] = time.perf_counter() - updated
