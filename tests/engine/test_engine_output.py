"""The output processor (engine/output_processor.py): stops, the held-back tail of a stop string, and
what a finished sample and request hand back. No model runs: tokens are fed by hand."""
import pytest
import torch

from minillm import SamplingParams
from minillm.config import EngineConfig, SpeculativeConfig
from minillm.engine.output_processor import OutputProcessor
from minillm.models.registry import resolve_model_path
from minillm.sequence import FinishReason, Sequence, SequenceStatus
from minillm.tokenizer import IncrementalDetokenizer, Tokenizer

TOKENIZER = Tokenizer(resolve_model_path("tiny"))
PLAIN = EngineConfig(model="tiny")
SPECULATIVE = EngineConfig(model="tiny", speculative=SpeculativeConfig(method="ngram"))
PROMPT = TOKENIZER.encode("x = ")


def finish(seq: Sequence, reason: FinishReason) -> None:
    """The scheduler's transition, without a scheduler."""
    seq.status, seq.finish_reason = SequenceStatus.FINISHED, reason


def sample(params: SamplingParams, index: int = 0, eos=(0,), request_id: str = "r") -> Sequence:
    detokenizer = IncrementalDetokenizer(TOKENIZER, PROMPT)
    seq = Sequence(request_id, "x = ", PROMPT, params, torch.Generator(), detokenizer, eos, index=index)
    seq.status = SequenceStatus.RUNNING
    return seq


def feed(outputs: OutputProcessor, seq: Sequence, text: str):
    """Append text's tokens one per step until the sequence finishes; yields each step's chunk."""
    for token in TOKENIZER.encode(text, add_special_tokens=False):
        yield outputs.append(seq, [token], 0.0)
        if seq.is_finished:
            return


def test_text_that_could_start_a_stop_string_is_held_back_until_it_cannot():
    outputs = OutputProcessor(PLAIN, finish)
    outputs.track("r")
    seq = sample(SamplingParams(max_tokens=64, stop=["STOP", "<|x|>"]))
    shown = ""
    for chunk in feed(outputs, seq, "hello world and more words here"):
        shown += chunk.text
        assert seq.output_text.startswith(shown)
        if not chunk.finished:  # the longest stop string is 5 characters: its first 4 may be on screen
            assert len(seq.output_text) - len(shown) == min(4, len(seq.output_text))
    assert not seq.is_finished and shown == seq.output_text[:-4]


def test_a_stop_string_cuts_the_text_before_it_and_finishes_the_sample():
    outputs = OutputProcessor(PLAIN, finish)
    outputs.track("r")
    seq = sample(SamplingParams(max_tokens=64, stop=["STOP"]))
    chunks = list(feed(outputs, seq, "hello world STOP and then more"))
    last = chunks[-1]
    assert last.finished and seq.finish_reason == FinishReason.STOP
    assert "".join(c.text for c in chunks) == "hello world " == last.output.text == last.request.text
    assert last.request.outputs == [last.output] and last.output.finish_reason == "stop"


def test_a_stop_token_and_max_tokens_flush_the_whole_text():
    outputs = OutputProcessor(PLAIN, finish)
    outputs.track("r")
    seq = sample(SamplingParams(max_tokens=64, stop=["never appears"]), eos=(7,))
    chunks = [*feed(outputs, seq, "a b c"), outputs.append(seq, [7], 0.0)]  # the stop token
    assert seq.finish_reason == FinishReason.STOP and "".join(c.text for c in chunks) == seq.output_text
    assert seq.output_token_ids[-1] == 7
    outputs.track("s")
    seq = sample(SamplingParams(max_tokens=3, stop=["never appears"]), request_id="s")
    chunks = list(feed(outputs, seq, "one two three four five"))
    assert seq.finish_reason == FinishReason.LENGTH and len(seq.output_token_ids) == 3
    assert "".join(c.text for c in chunks) == seq.output_text != ""


def test_tokens_after_the_one_that_stops_a_sample_are_dropped():
    """Speculation emits several tokens a step: the sample ends at the first that stops it."""
    outputs = OutputProcessor(SPECULATIVE, finish)
    outputs.track("r")
    seq = sample(SamplingParams(max_tokens=64), eos=(9,))
    chunk = outputs.append(seq, [20, 9, 21, 22], 0.0)
    assert chunk.finished and chunk.token_ids == [20, 9] and seq.output_token_ids == [20, 9]
    assert {"spec_proposed", "spec_accepted"} <= chunk.output.metrics.keys()


def test_the_request_output_waits_for_every_sample_in_index_order():
    outputs = OutputProcessor(PLAIN, finish)
    outputs.track("r")
    params = SamplingParams(max_tokens=1, n=2)
    second, first = sample(params, index=1), sample(params, index=0)
    chunk = outputs.append(second, [30], 0.0)
    assert chunk.finished and chunk.request is None
    assert [c.index for c in outputs.finished_samples("r")] == [1]
    chunk = outputs.append(first, [31], 0.0)
    assert [c.index for c in chunk.request.outputs] == [0, 1]
    outputs.track("r")  # finished: its id is free again


def test_an_id_still_live_is_refused():
    outputs = OutputProcessor(PLAIN, finish)
    outputs.track("r")
    with pytest.raises(ValueError, match="'r' is already in use"):
        outputs.track("r")
    outputs.forget("r")
    outputs.track("r")
