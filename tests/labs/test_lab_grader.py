"""The grader is itself tested: labs/ is what solutions/ generates, every graded test fails on the
learner stubs, every plausible wrong implementation in negatives/ is caught, every exercise is graded."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

from minillm.labkit.cell_loader import load_notebook
from minillm.labkit.grading import graded_tests, grader_module, property_of, run_graded
from minillm.labkit.notebook import lab_sources, learner_copy, read_source, to_json
from minillm.testing import give_memory_back

ROOT = Path(__file__).resolve().parents[2]
SOURCES = lab_sources(ROOT)
LABS = [s.stem[3:5] for s in SOURCES]
NEGATIVES = sorted((Path(__file__).parent / "negatives").glob("lab*.py"))


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.stem)
def test_generated_notebooks_are_in_sync_with_their_source(source):
    solution = read_source(source)
    for path, expected in ((ROOT / "solutions" / f"{source.stem}.ipynb", to_json(solution)),
                           (ROOT / "labs" / f"{source.stem}.ipynb", to_json(learner_copy(solution, source.stem)))):
        assert path.is_file() and path.read_text() == expected, \
            f"{path.relative_to(ROOT)} is not what {source.relative_to(ROOT)} generates: run `make labs`"


def test_no_notebook_without_a_source():
    stems = {s.stem for s in SOURCES}
    for folder in ("labs", "solutions"):
        strays = [p.name for p in (ROOT / folder).glob("lab*.ipynb") if p.stem not in stems]
        assert not strays, f"{folder}/ has notebooks no solutions/*.py generates: {strays}"


@pytest.mark.parametrize("lab", LABS, ids=lambda lab: f"lab{lab}")  # so that -k lab05 selects them
def test_every_exercise_is_graded_and_every_grade_has_an_exercise(lab):
    module = grader_module(lab)
    in_notebook = load_notebook(next((ROOT / "solutions").glob(f"lab{lab}_*.ipynb"))).exercises
    tested = {fn.exercise for fn in graded_tests(module)}
    end_to_end = {e for e in tested if e.endswith(".E")}  # the lab's parts together in the real engine
    assert in_notebook == tested - end_to_end and tested == set(module.EXERCISES), \
        (f"lab {lab}: notebook exercises {sorted(in_notebook)}, graded {sorted(tested)}, "
         f"listed {sorted(module.EXERCISES)}")
    assert 4 <= len(in_notebook) <= 8, f"lab {lab} has {len(in_notebook)} exercises; a lab has 4 to 8"


@pytest.mark.subprocess
@pytest.mark.timeout(300)
def test_every_graded_test_fails_on_the_learner_stubs(tmp_path):
    """The real grader (`pytest --target DIR`) on freshly generated stubs: all fail, nothing errors."""
    for source in SOURCES:
        (tmp_path / f"{source.stem}.ipynb").write_text(to_json(learner_copy(read_source(source), source.stem)))
    graders = [str(p) for lab in LABS for p in (ROOT / "tests" / "labs").glob(f"test_lab{lab}_*.py")]
    expected = sum(len(graded_tests(grader_module(lab))) for lab in LABS)
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--target", str(tmp_path),
                          *graders], cwd=ROOT, capture_output=True, text=True, timeout=280)
    summary = run.stdout.strip().splitlines()[-1]
    assert re.fullmatch(rf"{expected} failed in .*", summary), \
        f"expected {expected} failures, got: {summary}\n{run.stdout[-3000:]}"
    assert "not implemented yet" in run.stdout and "gradebook" in run.stdout
    for lab in LABS:
        assert re.search(rf"^{lab}\s+total\s+0/\d+$", run.stdout, re.M), f"lab {lab} scored points on stubs"


CAUGHT: dict[str, set[tuple[str, str]]] = {}  # lab -> (exercise, property) of the graded tests some negative failed
GRADED: set[Path] = set()  # the negatives graded on their own exercise in this process


def run_negative(negative: Path, exercise: str | None = None) -> list:
    """The solution notebook with one wrong implementation swapped in, graded on its exercise
    (or on `exercise`); records which graded tests caught it."""
    lab = negative.stem[3:5]
    loaded = load_notebook(next((ROOT / "solutions").glob(f"lab{lab}_*.ipynb")))
    assert not loaded.problems, loaded.problems
    scope = {}
    exec(compile(negative.read_text(), str(negative), "exec"), loaded.namespace, scope)
    loaded.namespace.update(scope)
    outcomes = run_graded(grader_module(lab), loaded.namespace, exercise or scope["EXERCISE"])
    del loaded, scope
    # A lab's end-to-end tests build engines and servers, held by cycles through the notebook's namespace: one
    # lab's negatives in a row reached 6 GB in one worker before the collector ran.
    give_memory_back(above=2 << 30, grown=256 << 20)
    CAUGHT.setdefault(lab, set()).update((o.exercise, o.prop) for o in outcomes if not o.passed)
    if exercise is None:
        GRADED.add(negative)
    return outcomes


@pytest.mark.parametrize("negative", NEGATIVES, ids=lambda p: p.stem)
def test_wrong_implementation_is_caught(negative):
    exercise = re.search(r'^EXERCISE = "(.+)"', negative.read_text(), re.M).group(1)
    outcomes = run_negative(negative)
    assert outcomes, f"no graded tests for exercise {exercise}"
    assert not all(o.passed for o in outcomes), f"{negative.name} passes every test of exercise {exercise}"


@pytest.mark.timeout(600)
@pytest.mark.parametrize("lab", LABS, ids=lambda lab: f"lab{lab}")  # so that -k lab05 selects them
def test_every_graded_test_catches_some_wrong_implementation(lab):
    """A test that no plausible wrong implementation fails proves nothing: each graded test must
    fail for at least one negative of its exercise (the end-to-end test: of a part it plugs in)."""
    from minillm.labkit.plug import PARTS, STACK_PARTS
    mine = [n for n in NEGATIVES if n.stem[3:5] == lab]
    for negative in mine:  # those the per-negative tests did not grade in this process (-k, another xdist worker)
        if negative not in GRADED:
            run_negative(negative)
    module = grader_module(lab)
    end_to_end = [fn for fn in graded_tests(module) if fn.exercise.endswith(".E")]
    plugged = {exercise for exercise in [e for e, _ in PARTS.values()] + list(STACK_PARTS.values())
               if exercise.split(".")[0].zfill(2) == lab}
    # One run of a negative on an end-to-end exercise grades all of that exercise's tests: each runs once, and only
    # until every end-to-end test has caught something (trying them afresh per test ran lab 08's 18 times, not 7)
    tried: set[tuple[Path, str]] = set()
    for fn in end_to_end:
        for negative in (n for n in mine if re.search(r'^EXERCISE = "(.+)"', n.read_text(), re.M).group(1)
                         in plugged):
            if (fn.exercise, property_of(fn)) in CAUGHT[lab]:
                break
            if (negative, fn.exercise) not in tried:
                tried.add((negative, fn.exercise))
                run_negative(negative, fn.exercise)
    uncaught = [f"{fn.exercise} {fn.__name__}" for fn in graded_tests(module)
                if (fn.exercise, property_of(fn)) not in CAUGHT[lab]]
    assert not uncaught, f"lab {lab}: graded tests that no negative in tests/labs/negatives fails: {uncaught}"
