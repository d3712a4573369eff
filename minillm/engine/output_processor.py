"""The output processor: a step's new tokens -> text, stops, and what the caller receives.

For each sequence that emitted tokens it appends them, detokenizes incrementally, and finishes the
sequence at the first token that stops it: a stop token (EOS unless ignore_eos), a stop string
(the text is cut before it; one inside the text of the first min_tokens tokens does not count, as
in vLLM), the end of its grammar, or max_tokens. It streams only text that is safe to show: while
a sequence runs, a tail that could still grow into a stop string is held back.
A sample's last chunk carries its Completion; a request's last one the whole RequestOutput.

The finishing itself is the scheduler's (a status change frees the sequence's blocks): this module
decides *that* and *why* a sequence stops, and calls `finish` to make it so.
"""
from collections.abc import Callable

from minillm.config import EngineConfig
from minillm.engine.isolation import fail_alone
from minillm.outputs import Completion, RequestOutput, StreamChunk
from minillm.sequence import FinishReason, Sequence


class OutputProcessor:
    """Turns each sequence's new tokens into StreamChunks: incremental text, stop checks, and the
    Completion and RequestOutput of what finished."""
    def __init__(self, config: EngineConfig, finish: Callable[[Sequence, FinishReason], None]) -> None:
        """finish: the scheduler's transition to FINISHED. With speculative decoding, completions report the
        proposals."""
        self._finish, self._speculative = finish, config.speculative is not None
        self._done: dict[str, list[Completion]] = {}  # per live request: its finished samples

    # -- the live requests ---------------------------------------------------------------------
    def track(self, request_id: str) -> None:
        """Start collecting a request's samples; an id still live raises ValueError."""
        if request_id in self._done:
            raise ValueError(f"request id {request_id!r} is already in use")
        self._done[request_id] = []

    def forget(self, request_id: str) -> None:
        """The request left the engine unfinished (aborted, handed off): its id is free again."""
        self._done.pop(request_id, None)

    def finished_samples(self, request_id: str) -> list[Completion]:
        """The samples of a live request that have finished so far."""
        return list(self._done[request_id])

    # -- a step's tokens -------------------------------------------------------------------------
    def append(self, seq: Sequence, tokens: list[int], now: float) -> StreamChunk:
        """Add a step's tokens to their sequence (one, or several when speculating), detokenize
        them, and finish the sequence at the first that stops it (the rest are dropped). An error (the
        sampler found no token its constraints allow, or something raised for this sequence alone, here
        or in the sampler: engine/isolation.py) ends the sequence here, with finish_reason "error"."""
        if seq.error is None:
            try:
                reason, kept = self._advance(seq, tokens, now)
            except Exception as e:  # its detokenizing, stop strings or grammar raised: it ends alone
                fail_alone(seq, "detokenizing and checking its stops", e)
            else:
                if reason is not None:  # outside the try: a fault in freeing its blocks is the engine's, not its own
                    seq.metrics.finished_time = now
                    self._finish(seq, reason)
                    if seq.logprobs is not None:
                        del seq.logprobs[len(seq.output_token_ids):]
                return self._chunk(seq, kept)
        if not seq.is_finished:  # what raised may have come after its finish
            seq.metrics.finished_time = now
            self._finish(seq, FinishReason.ERROR)
        return self._chunk(seq, [])

    def _advance(self, seq: Sequence, tokens: list[int], now: float) -> tuple[FinishReason | None, list[int]]:
        """Append, detokenize and check each token for a stop: -> (why it finishes, or None; the tokens kept)."""
        for n, token in enumerate(tokens, 1):
            seq.token_ids.append(token)
            seq.metrics.token_times.append(now)
            before = len(seq.output_text)  # a new stop string ends past here: the text before was searched
            seq.output_text += seq.detokenizer.push(token)
            if len(seq.token_ids) - seq.num_prompt_tokens == seq.params.min_tokens:
                seq.stop_text_from = len(seq.output_text)  # min_tokens holds back stop strings too, as vLLM does
            if seq.grammar is not None:
                seq.grammar.accept(token)
            reason = None
            if token in seq.stop_token_ids or cut_at_stop_string(seq, before) or (seq.grammar and seq.grammar.finished):
                reason = FinishReason.STOP
            elif len(seq.token_ids) - seq.num_prompt_tokens >= seq.params.max_tokens:
                reason = FinishReason.LENGTH
            if reason is not None:
                if reason == FinishReason.LENGTH or token in seq.stop_token_ids:
                    seq.output_text += seq.detokenizer.flush()
                    cut_at_stop_string(seq, before)
                return reason, tokens[:n]
        return None, tokens

    def _chunk(self, seq: Sequence, token_ids: list[int]) -> StreamChunk:
        """What the caller receives of this step: the text safe to show, and the output once finished."""
        delta = seq.output_text[seq.emitted_chars:shown_end(seq)]
        seq.emitted_chars += len(delta)
        chunk = StreamChunk(seq.request_id, seq.index, delta, token_ids, seq.is_finished,
                            logprobs=None if seq.logprobs is None else seq.logprobs[-len(token_ids):])
        if seq.is_finished:
            chunk.output = self.completion_of(seq)
            done = self._done[seq.request_id]
            done.append(chunk.output)
            if len(done) == seq.params.n:
                del self._done[seq.request_id]
                chunk.request = RequestOutput(seq.request_id, seq.prompt, seq.prompt_token_ids,
                                              sorted(done, key=lambda c: c.index))
        return chunk

    def completion_of(self, seq: Sequence) -> Completion:
        metrics = {**seq.metrics.as_dict(), "cached_prompt_tokens": seq.num_cached_prompt_tokens}
        if self._speculative:
            metrics.update(spec_proposed=seq.num_proposed, spec_accepted=seq.num_accepted)
        return Completion(seq.index, seq.output_text, seq.output_token_ids, seq.finish_reason, metrics,
                          None if seq.logprobs is None else list(seq.logprobs), seq.error, seq.fault)


def cut_at_stop_string(seq: Sequence, since: int = 0) -> bool:
    """Cut the text before the first stop string that ends past seq.stop_text_from (the text of the
    first min_tokens tokens) and past `since` (the text up to there was searched already), if one has
    appeared; -> whether one did. Each token costs a search of its own text and a stop string's length
    before it, whatever the length of the output."""
    if len(seq.output_token_ids) < seq.params.min_tokens:
        return False
    searched = max(since, seq.stop_text_from)
    found = (seq.output_text.find(s, max(0, searched - len(s) + 1)) for s in seq.params.stop)
    hits = [i for i in found if i >= 0]
    if hits:
        seq.output_text = seq.output_text[:min(hits)]
    return bool(hits)


def shown_end(seq: Sequence) -> int:
    """How far into output_text the caller may see: all of it once finished; while running, all but
    a tail one character shorter than the longest stop string (it could still become one), and
    never less than what was already shown."""
    end = len(seq.output_text)
    if not seq.is_finished and seq.params.stop:
        end -= max(len(s) for s in seq.params.stop) - 1
    return max(end, seq.emitted_chars)
