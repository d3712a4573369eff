"""LLMEngine: the engine core: requests in, the step loop, chunks out.

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

Synchronous on purpose: every step is one visible, testable unit of work. The core keeps only what
makes steps happen; three parts beside it are its other faces. `view` (engine_view.py) reads the
queues and the KV pool: observers (the visualizer, benchmarks) read the engine through it and the
StepEvents. `kv_offload` is the paged cache's second tier (cache/offload.py); `handoff`
(prefill_handoff.py) moves a computed prompt between engines, for disaggregated serving.
"""
import functools
import time

import torch

from minillm.cache import make_cache_manager
from minillm.cache.offload import KVOffload
from minillm.config import EngineConfig
from minillm.engine.decoding import Decoding, PlainDecoding
from minillm.engine.engine_view import EngineView
from minillm.engine.input_processor import InputProcessor, ServedModel
from minillm.engine.model_setup import setup_model
from minillm.engine.output_processor import OutputProcessor
from minillm.engine.prefill_handoff import PrefillHandoff
from minillm.engine.runner import ModelRunner
from minillm.engine.sampler import Sampler, first_rows
from minillm.engine.scheduler import Scheduler
from minillm.models.model_config import ModelConfig
from minillm.models.registry import resolve_model_path
from minillm.outputs import StreamChunk
from minillm.sampling import SamplingParams
from minillm.sequence import EngineRequest
from minillm.speculative.proposers import make_proposer
from minillm.speculative.speculator import Speculator
from minillm.speculative.target import ProposerTarget
from minillm.step import ScheduledSeq, ScheduledWork, StepEvent, Verification
from minillm.tokenizer import Tokenizer
from minillm.tp.driver import TensorParallelDriver


class LLMEngine:
    """The engine core: requests in (add_request), one step at a time (step), chunks out. It owns the input
    processor, the scheduler, the cache, the model runner, the decoding strategy, the sampler and the output
    processor, and tells its observers (subscribe) a StepEvent after every step. Each part receives the
    config and the parts it reads. Its other faces: view, kv_offload, handoff."""
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
        served = ServedModel(self.model_dir, self.tokenizer, self.model_config.vocab_size, self.eos_token_ids,
                             self.max_model_len)
        self.input_processor = InputProcessor(config, served, self.cache, self.scheduler)
        self.sampler = Sampler(config)
        self.output_processor = OutputProcessor(config, self.scheduler.finish)
        self.view = EngineView(self.scheduler, self.cache)
        self.handoff = PrefillHandoff(config, self.cache, self.scheduler, self.input_processor,
                                      self.output_processor, self.abort)
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

    @property
    def kv_offload(self) -> KVOffload:
        """The KV cache's second tier, for the blocks of agents waiting on tools (cache/offload.py):
        attach(kind, capacity), offload_prefix(token_ids), stats(). The paged cache has one."""
        offload = getattr(self.cache, "offload", None)
        if offload is None:
            raise ValueError(f"KV offload needs kv_cache='paged', got {self.config.cache.kind.value!r}")
        return offload

    # -- observers --------------------------------------------------------------------------
    def subscribe(self, observer) -> None:
        """Call observer(StepEvent) after every step."""
        self._observers.append(observer)

    def unsubscribe(self, observer) -> None:
        self._observers.remove(observer)

    # -- the core ---------------------------------------------------------------------------
    def has_unfinished(self) -> bool:
        """Whether a request is still queued or running: the driving loop's `while`."""
        return self.scheduler.has_unfinished()

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
            view = self.view
            event = StepEvent(
                step=self.num_steps, start=start, duration=now - start,
                scheduled=[ScheduledWork(b.seq.request_id, b.seq.index, b.num_tokens, b.phase) for b in batch],
                finished=[c.request_id for c in chunks if c.request is not None],
                waiting=view.num_waiting, running=view.num_running, kv=view.kv_stats(), sequences=view.sequences(),
                preempted=list(self.scheduler.preempted_now), num_preemptions=view.num_preemptions,
                output_tokens=sum(len(c.token_ids) for c in chunks), timings=dict(self.last_step_timings),
                verifications=verifications)
            for observer in self._observers:
                observer(event)
        self.last_step_timings["telemetry"] = time.perf_counter() - updated
