"""The prefill hand-off: a request leaves one engine with its prompt computed, and joins another (LLMEngine.handoff).

Disaggregated serving (disagg/) runs the prompts on one engine and the decoding on another:

    prefilled = prefill_engine.handoff.give(request_id, pack)      # its K/V copied out, the request gone
    chunks = decode_engine.handoff.take(prefilled, params, request_id, unpack)   # admitted, computed

Both sides move paged blocks and tokens only. The part is composed over the engine's own parts (the
input processor, the scheduler, the cache, the output processor) and changes them only through
their transitions, as a step does; how the K/V travel between the two is the caller's (pack, unpack).
"""
import time
from collections.abc import Callable

from minillm.arith import cdiv
from minillm.cache.base import CacheManager
from minillm.config import CacheKind, EngineConfig
from minillm.engine.input_processor import InputProcessor
from minillm.engine.output_processor import OutputProcessor
from minillm.engine.scheduler import Scheduler
from minillm.outputs import StreamChunk
from minillm.sampling import SamplingParams
from minillm.sequence import PrefilledPrompt, Sequence


class PrefillHandoff:
    """give() a request whose prompt was just computed here, take() one whose prompt another engine computed."""
    def __init__(self, config: EngineConfig, cache: CacheManager, scheduler: Scheduler,
                 input_processor: InputProcessor, output_processor: OutputProcessor,
                 abort: Callable[[str], bool]) -> None:
        """abort: the engine's (LLMEngine.abort), the one way a request leaves it unfinished."""
        self.config, self.cache, self.scheduler = config, cache, scheduler
        self.input_processor, self.output_processor, self._abort = input_processor, output_processor, abort

    def give(self, request_id: str, pack: Callable) -> PrefilledPrompt:
        """Give away a request whose prompt was computed in the latest step (its samples have
        their first tokens) so that another engine decodes it: pack(pool, blocks, num_prompt_tokens)
        copies its prompt's K/V out of this pool, then the request leaves this engine (its blocks
        go back; with prefix caching, its full ones stay cached for later prompts)."""
        samples = [s for s in self.scheduler.running if s.request_id == request_id]
        if not samples or any(len(s.token_ids) != s.num_prompt_tokens + 1 or not s.is_decoding for s in samples):
            raise ValueError(f"request {request_id!r} is not a prompt just computed, with its first token and "
                             f"nothing else: {samples or 'it is not running'}")
        self._check("handoff.give moves", samples[0].params)
        head, by_index = samples[0], {s.index: s for s in samples}
        done = {c.index: c for c in self.output_processor.finished_samples(request_id)}  # stopped at their first token
        kv = pack(self.cache.pool, self.cache.block_table(head), head.num_prompt_tokens)
        prefilled = PrefilledPrompt(
            head.prompt_token_ids, [by_index[i].token_ids[-1] if i in by_index else done[i].token_ids[0]
                                    for i in range(head.params.n)], kv,
            [by_index[i].generator.get_state() if i in by_index else None for i in range(head.params.n)],
            head.metrics.arrival_time, head.metrics.first_scheduled_time)
        self._abort(request_id)
        return prefilled

    def take(self, prefilled: PrefilledPrompt, params: SamplingParams, request_id: str, unpack: Callable,
             prompt: str | None = None) -> list[StreamChunk] | None:
        """Admit a request whose prompt another engine computed (its handoff.give): fresh blocks that
        unpack(kv, pool, blocks) fills with the prompt's K/V (kv: [2, layers, prompt tokens, kv_heads,
        head_dim]), the prompt counted as computed, then each sample appends its first token as if it
        had sampled it here (its generator continues from the state the other engine left).
        -> the first tokens' chunks; None when the scheduler cannot start it now (max_num_seqs
        reached, sequences waiting ahead of it, or no free blocks): nothing changed, offer it again later."""
        self._check("handoff.take takes", params)
        if len(prefilled.first_tokens) != params.n:
            raise ValueError(f"got {len(prefilled.first_tokens)} first tokens for n = {params.n} samples")
        request = self.input_processor.process(prefilled.prompt_ids, params, request_id)
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

    def _check(self, what: str, params: SamplingParams) -> None:
        config = self.config
        if config.cache.kind != CacheKind.PAGED or config.speculative is not None or params.logprobs is not None:
            raise ValueError(f"{what} paged blocks and tokens only: it needs kv_cache='paged', no speculative "
                             f"decoding and no logprobs")
