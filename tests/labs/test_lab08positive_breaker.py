"""The grader of exercise 8.8 on a CORRECT breaker written another way: it must pass.

A test that compares a learner's breaker with the reference must accept any breaker that keeps the contract
(the same rules, in the same order, at the same boundaries, a reason that starts with the rule's name), however
its reasons are worded and in whatever order it does its bookkeeping. Issue 53, item 8: the end-to-end test 8.E
once failed such a breaker (it compared the reference's reasons with themselves and the whole strings with the
harness's). This file is named outside `test_lab08_*.py` on purpose: the run of the graders on the learner stubs
(tests/labs/test_lab_grader.py) expects every test it collects there to fail.
"""
import importlib.util
from collections import deque
from pathlib import Path

from minillm.agents.breaker import normalise
from minillm.labkit.cell_loader import Lab

GRADER = Path(__file__).with_name("test_lab08_serving.py")


def grader():
    spec = importlib.util.spec_from_file_location("lab08_grader_for_positives", GRADER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class OtherWordsBreaker:
    """Correct, in other words and another order: counts in a dict, checks the caps from last to first and keeps
    the first rule that fires in the contract's order; reasons without a colon, in other words."""

    def __init__(self, max_calls, max_tokens, repeat_window, max_repeats):
        caps = {"max_repeats": max_repeats, "repeat_window": repeat_window, "max_tokens": max_tokens,
                "max_calls": max_calls}
        for name, value in caps.items():
            if type(value) is not int or value < 1:
                raise ValueError(f"{name}={value!r} is not a whole number of at least 1")
        if repeat_window < max_repeats:
            raise ValueError(f"a window of {repeat_window} cannot hold {max_repeats} repeats")
        self.caps = caps
        self.window: deque[str] = deque(maxlen=repeat_window)
        self.used = {"calls": 0, "tokens": 0}

    def check(self, output, tokens):
        self.window.append(normalise(output))
        self.used["tokens"] += tokens
        self.used["calls"] += 1
        fired = {}
        if self.used["calls"] >= self.caps["max_calls"]:
            fired["calls"] = f"calls cap of {self.caps['max_calls']} reached"
        if self.used["tokens"] >= self.caps["max_tokens"]:
            fired["tokens"] = f"TOKENS budget spent ({self.used['tokens']})"
        same = sum(1 for seen in self.window if seen == self.window[-1])
        if same >= self.caps["max_repeats"]:
            fired["repeat"] = f"Repeat detected - {same} alike"
        return next((fired[rule] for rule in ("repeat", "tokens", "calls") if rule in fired), None)


def test_a_correct_breaker_in_other_words_passes_every_breaker_test():
    module = grader()
    # the serving stack's other parts of lab 08 are the engine's own: only the breaker is under test
    from minillm.perf.serving import goodput, percentile, request_metrics
    from minillm.serve.admission import admit
    from minillm.serve.arrivals import arrival_times
    from minillm.serve.sse import parse_sse
    namespace = {"parse_sse": parse_sse, "request_metrics": request_metrics, "percentile": percentile,
                 "goodput": goodput, "arrival_times": arrival_times, "admit": admit}
    namespace["LoopBreaker"] = OtherWordsBreaker
    tests = [module.test_breaker_fixed_cases, module.test_breaker_matches_the_reference_on_random_sessions,
             module.test_your_loop_breaker_stops_the_real_agent_harness]
    for fn in tests:
        fn(Lab(namespace, fn.exercise, where="a correct breaker in other words"))
