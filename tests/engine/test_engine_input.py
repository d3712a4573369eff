"""The input processor and the engine's thread seam: process_request validates and builds a request
without touching any queue (so another thread may call it while a step runs), enqueue queues it."""
import threading

import pytest

from minillm import SamplingParams
from minillm.config import Components, EngineConfig, SpeculativeConfig
from minillm.engine.engine import LLMEngine
from minillm.sampling import sample
from minillm.structured import StructuredOutput

GREEDY = dict(temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def engine():
    return LLMEngine(EngineConfig.from_knobs("tiny", num_kv_blocks=8, block_size=16, max_model_len=256))


def run(engine: LLMEngine) -> dict[str, list[int]]:
    """Step until idle; -> each finished request's tokens."""
    done = {}
    while engine.has_unfinished():
        done.update({c.request_id: c.request.token_ids for c in engine.step() if c.request is not None})
    return done


@pytest.mark.parametrize("prompt, params, error, match", [
    ("", None, ValueError, "prompt is empty"),
    ([], None, ValueError, "prompt_token_ids is empty"),
    ([1, -3, 2], None, ValueError, r"integers in \[0, \d+\), got \[-3\]"),
    ([1] * 200, SamplingParams(max_tokens=100), ValueError, "exceeds the context length of 256"),
    ([1] * 100, SamplingParams(max_tokens=100, n=2), ValueError, "could never fit in the KV pool of 8 blocks"),
    ("x", {"max_tokens": 3}, TypeError, "must be a SamplingParams, got dict"),
    ("x", SamplingParams(structured=StructuredOutput(regex="(")), ValueError, "cannot be compiled"),
])
def test_bad_input_is_refused_before_anything_is_queued(engine, prompt, params, error, match):
    with pytest.raises(error, match=match):
        engine.process_request(prompt, params, "bad")
    with pytest.raises(error, match=match):
        engine.add_request(prompt, params, "bad")
    assert engine.view.num_waiting == engine.view.num_running == 0 and not engine.has_unfinished()
    assert engine.add_request("ok", SamplingParams(max_tokens=2), "bad") == "bad"  # the id was never taken
    assert set(run(engine)) == {"bad"}


def test_process_request_builds_the_samples_and_queues_nothing(engine):
    request = engine.process_request("def f(x):", SamplingParams(max_tokens=3, n=3, seed=5), "r1")
    assert (request.request_id, request.prompt) == ("r1", "def f(x):")
    assert request.prompt_token_ids == engine.tokenizer.encode("def f(x):")
    assert [s.index for s in request.samples] == [0, 1, 2] and request.samples[0].forks == request.samples[1:]
    assert engine.view.num_waiting == 0 and not engine.has_unfinished()
    assert engine.enqueue(request) == "r1" and engine.view.num_waiting == 1
    with pytest.raises(ValueError, match="'r1' is already in use"):
        engine.enqueue(engine.process_request("x", SamplingParams(max_tokens=1), "r1"))
    assert engine.view.num_waiting == 1
    assert list(run(engine)) == ["r1"]


def test_add_request_is_enqueue_of_process_request(engine):
    params = SamplingParams(max_tokens=6, **GREEDY)
    engine.add_request("import os", params, "a")
    direct = run(engine)["a"]
    engine.enqueue(engine.process_request("import os", params, "b"))
    assert run(engine)["b"] == direct


def test_structured_output_is_refused_with_speculative_decoding():
    engine = LLMEngine(EngineConfig(model="tiny", speculative=SpeculativeConfig("ngram")))
    with pytest.raises(ValueError, match="not supported with speculative decoding"):
        engine.process_request("x", SamplingParams(structured=StructuredOutput(regex="[ab]+")))


def test_process_request_on_another_thread_while_a_step_runs():
    """The step thread blocks inside its own sampling until a second thread has processed three
    requests (one structured: its grammar compiles meanwhile); it then queues them, and they give
    what they give when added on the step thread."""
    in_step, processed = threading.Event(), threading.Event()

    def blocking_sample(*args):
        in_step.set()
        assert processed.wait(timeout=60), "the other thread never finished processing"
        return sample(*args)

    engine = LLMEngine(EngineConfig(model="tiny", components=Components(sample=blocking_sample)))
    prompts = ["def add(a, b):", "import sys\n", "x = "]
    params = [SamplingParams(max_tokens=8, temperature=0.8, seed=3),
              SamplingParams(max_tokens=8, **GREEDY),
              SamplingParams(max_tokens=8, temperature=0, structured=StructuredOutput(regex="[0-9]{4}"))]
    requests, errors = [], []

    def other_thread():
        in_step.wait(timeout=60)
        try:
            requests.extend(engine.process_request(p, sp, f"t{i}") for i, (p, sp) in enumerate(zip(prompts, params)))
        except BaseException as e:  # reported by the main thread
            errors.append(e)
        processed.set()

    thread = threading.Thread(target=other_thread)
    thread.start()
    engine.add_request("while True:", SamplingParams(max_tokens=4, **GREEDY), "main")
    engine.step()  # blocks in sampling until the thread is done
    thread.join(timeout=60)
    assert not errors and [r.request_id for r in requests] == ["t0", "t1", "t2"]
    assert engine.view.num_waiting == 0  # processing queued nothing
    for request in requests:
        engine.enqueue(request)
    got = run(engine)
    for i, (p, sp) in enumerate(zip(prompts, params)):
        engine.add_request(p, sp, f"again{i}")
    again = run(engine)
    assert [got[f"t{i}"] for i in range(3)] == [again[f"again{i}"] for i in range(3)]
    assert engine.tokenizer.decode(got["t2"]).isdigit()


def test_a_long_text_tokenizes_as_a_short_one_does():
    """Texts over LONG_TEXT characters go through encode_batch (it lets go of the GIL): the same ids as encode."""
    from minillm import LLM
    from minillm.tokenizer import LONG_TEXT
    tok = LLM("tiny").tokenizer
    text = "def f(x):\n    return x * 2  # ünïcode, tabs\t and emoji 🙂\n" * (LONG_TEXT // 40)
    assert len(text) > LONG_TEXT
    for special in (True, False):
        assert tok.encode(text, add_special_tokens=special) == tok._tok.encode(text, add_special_tokens=special).ids
