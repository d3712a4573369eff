"""Graded tests, and running them outside pytest: `check("1.3")` in a notebook, and the grader's
own tests (stubs must fail, wrong implementations must be caught).

A graded test is a function of one argument, the `lab` (the target's definitions), marked with
the exercise it grades:

    @exercise("1.1")
    def test_rms_norm_matches_formula(lab):
        "RMSNorm matches y = x / sqrt(mean(x^2) + eps) * weight"
        assert close(lab.rms_norm(x, w, 1e-6), ref), "output differs from the formula"
"""
import contextlib
import importlib.util
import signal
import sys
import threading
import traceback
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from minillm.labkit.cell_loader import Lab

DEFAULT_TIMEOUT_S = 60


def exercise(exercise_id: str, timeout: float = DEFAULT_TIMEOUT_S):
    """Mark a graded test: the exercise it grades, and its time limit in seconds."""
    import pytest

    def mark(fn):
        fn.exercise = exercise_id
        fn.timeout = timeout
        return pytest.mark.exercise(exercise_id)(pytest.mark.timeout(timeout)(fn))
    return mark


def lab_of(exercise_id: str) -> str:
    """'1.3' -> '01'"""
    return exercise_id.split(".")[0].zfill(2)


def tests_dir() -> Path:
    return Path(__file__).resolve().parents[2] / "tests" / "labs"


@cache
def grader_module(lab: str):
    """The grader module tests/labs/test_labNN_<slug>.py, imported under a private name."""
    found = sorted(tests_dir().glob(f"test_lab{lab}_*.py"))
    if not found:
        raise FileNotFoundError(f"no grader for lab {lab} in {tests_dir()} (check() needs the course repository)")
    spec = importlib.util.spec_from_file_location(f"labkit_grader_lab{lab}", found[0])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def graded_tests(module, exercise_id: str | None = None) -> list:
    return [fn for name, fn in vars(module).items() if name.startswith("test_") and hasattr(fn, "exercise")
            and exercise_id in (None, fn.exercise)]


def property_of(fn) -> str:
    """The property a test checks, in words: its docstring's first paragraph (however many lines it is wrapped
    over), else its name."""
    paragraph = (fn.__doc__ or "").strip().split("\n\n")[0]
    return " ".join(paragraph.split()) or fn.__name__.removeprefix("test_").replace("_", " ")


@dataclass
class Outcome:
    exercise: str
    prop: str
    passed: bool
    message: str = ""


def run_graded(module, namespace: dict, exercise_id: str | None = None, problems: dict | None = None,
               exercises: set | None = None, where: str = "the notebook") -> list[Outcome]:
    """Run the graded tests of `module` (one exercise, or all) against `namespace`, each under its
    time limit; never raises for a failing test."""
    outcomes = []
    for fn in graded_tests(module, exercise_id):
        lab = Lab(namespace, fn.exercise, problems, exercises, where)
        try:
            with time_limit(fn.timeout):
                fn(lab)
            outcomes.append(Outcome(fn.exercise, property_of(fn), True))
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:  # any failure (pytest.raises' too) is a failed test, in words
            outcomes.append(Outcome(fn.exercise, property_of(fn), False, describe(e)))
    return outcomes


def describe(e: BaseException) -> str:
    """A failure in words: the assertion's message, or the exception and where it was raised."""
    if isinstance(e, AssertionError):
        return str(e).split("\nassert ")[0] or "an assertion failed"
    if isinstance(e, NotImplementedError):
        return f"not implemented yet ({e})"
    frames = [f for f in traceback.extract_tb(e.__traceback__)
              if "site-packages" not in f.filename and "/lib/python" not in f.filename]
    where = f" at {frames[-1].filename}, line {frames[-1].lineno}" if frames else ""
    return f"{type(e).__name__}: {e}{where}"


class Timeout(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds: float):
    """Interrupt the body after `seconds` (Unix main thread only; elsewhere no limit)."""
    if not hasattr(signal, "SIGALRM") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame):
        raise Timeout(f"took longer than {seconds:g} s (an endless loop?)")
    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def check(exercise_id: str) -> None:
    """Run the graded tests of one exercise against this notebook's current definitions and print
    the result. Call it in a notebook cell after the exercise: check("1.3")."""
    namespace = sys._getframe(1).f_globals
    outcomes = run_graded(grader_module(lab_of(exercise_id)), namespace, exercise_id, where="this notebook")
    if not outcomes:
        print(f"There is no exercise {exercise_id} in lab {lab_of(exercise_id)}.")
        return
    failed = [o for o in outcomes if not o.passed]
    if not failed:
        print(f"✅ Exercise {exercise_id}: {_checks(len(outcomes))} pass.")
        return
    if all(o.message.startswith("not implemented yet") for o in outcomes):
        print(f"⏳ Exercise {exercise_id}: not implemented yet ({_checks(len(outcomes))} waiting).")
        return
    print(f"❌ Exercise {exercise_id}: {len(failed)} of {_checks(len(outcomes))} fail.")
    for o in failed:
        print(f"   ✗ {o.prop}\n     {o.message}")


def _checks(n: int) -> str:
    return f"{n} check" if n == 1 else f"{n} checks"
