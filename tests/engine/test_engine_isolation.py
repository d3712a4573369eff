"""One request's failure is its own (engine/isolation.py): a per-request part of the step that raises for
one sequence (its logits processors, its draw, its logprobs, its stop check) ends that sequence with
finish_reason "error" and a message naming the stage, and every other sequence of the same steps gets the
tokens (and, to rounding, the logprobs) it gets without the poisoned one beside it."""
import pytest

import minillm.engine.output_processor as output_processor
import minillm.engine.sampler as sampler
import minillm.sampling as sampling
from minillm import LLM, SamplingParams

MARK = 0.77  # the temperature of the poisoned request
PROMPTS = ["def f():", "import os\n", "class A:"]
HEALTHY = SamplingParams(max_tokens=12, temperature=0, presence_penalty=0.5, logprobs=2, stop=["never"])
POISONED = SamplingParams(max_tokens=12, temperature=MARK, presence_penalty=0.5, logprobs=2, stop=["never"], seed=1)


def poisoned(params) -> bool:
    return params.temperature == MARK


def break_logits_processors(monkeypatch):
    real = sampler.process_logits
    monkeypatch.setattr(sampler, "process_logits", lambda logits, hs: (
        1 / 0 if any(poisoned(h.params) for h in hs) else real(logits, hs)))
    return "applying its logit_bias, penalties and min_tokens"


def break_sampling(monkeypatch):
    real = sampling.sample
    monkeypatch.setattr(sampling, "sample", lambda logits, t, k, p, g: 1 / 0 if t == MARK else real(logits, t, k, p, g))
    return "sampling"


def break_stop_check(monkeypatch):
    real = output_processor.cut_at_stop_string
    monkeypatch.setattr(output_processor, "cut_at_stop_string", lambda seq, *since: (
        1 / 0 if poisoned(seq.params) else real(seq, *since)))
    return "detokenizing and checking its stops"


@pytest.fixture(scope="module")
def llm():
    return LLM("tiny")


@pytest.mark.parametrize("breaker", [break_logits_processors, break_sampling, break_stop_check])
def test_a_sequence_whose_step_raises_ends_alone(llm, monkeypatch, breaker):
    alone = llm.generate(PROMPTS, HEALTHY, use_tqdm=False)
    stage = breaker(monkeypatch)
    *beside, bad = llm.generate([*PROMPTS, PROMPTS[0]], [HEALTHY] * len(PROMPTS) + [POISONED], use_tqdm=False)
    assert [(o.text, o.outputs[0].token_ids) for o in beside] == [(o.text, o.outputs[0].token_ids) for o in alone]
    for with_it, without in zip(beside, alone):  # a batch of another size rounds the logits a little otherwise
        assert with_it.outputs[0].logprobs == [pytest.approx(d, abs=1e-4) for d in without.outputs[0].logprobs]
    failed = bad.outputs[0]
    assert failed.finish_reason == "error" and failed.fault
    assert failed.error.startswith(f"the engine failed on this request while {stage}: ZeroDivisionError")
    assert not llm.engine.has_unfinished() and llm.engine.view.kv_stats().used_blocks == 0
