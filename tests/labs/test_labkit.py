"""The lab kit: learner work is never overwritten, bad notebooks get clear messages while the
rest is still graded, check() reports in words, an endless loop fails only its own test."""
import contextlib
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from minillm.labkit import check
from minillm.labkit.build import build, fresh
from minillm.labkit.cell_loader import load_notebook
from minillm.labkit.grading import graded_tests, grader_module, run_graded

ROOT = Path(__file__).resolve().parents[2]
LAB00 = next((ROOT / "solutions").glob("lab00_*.ipynb"))


@pytest.fixture
def course(tmp_path):
    """A copy of the lab sources, built: (root, path of lab 00's learner notebook)."""
    shutil.copytree(ROOT / "solutions", tmp_path / "solutions", ignore=shutil.ignore_patterns("*.ipynb"))
    build(tmp_path)
    return tmp_path, tmp_path / "labs" / LAB00.name


def edit_exercise(path: Path, exercise: str, source: str) -> None:
    nb = nbformat.read(path, as_version=4)
    next(c for c in nb.cells if c.metadata.get("exercise") == exercise).source = source
    nbformat.write(nb, path)


def grade(path: Path) -> dict[str, list]:
    """Lab 00's outcomes on the notebook at path, by exercise."""
    loaded = load_notebook(path)
    outcomes = run_graded(grader_module("00"), loaded.namespace, problems=loaded.problems,
                          exercises=loaded.exercises, where=path.name)
    by_exercise = {}
    for o in outcomes:
        by_exercise.setdefault(o.exercise, []).append(o)
    return by_exercise


def test_rebuild_keeps_an_edited_learner_notebook_and_writes_a_fresh_copy(course):
    root, lab00 = course
    edit_exercise(lab00, "0.2", "def roofline_time(flops, bytes_moved, peak_flops, bandwidth):\n    return 0.0")
    mine = lab00.read_text()
    messages = "\n".join(build(root))
    assert lab00.read_text() == mine, "the learner's notebook was overwritten"
    assert "exercise 0.2" in messages and "--force" in messages and "labs/fresh/" in messages, messages
    assert "raise NotImplementedError" in (root / "labs" / "fresh" / lab00.name).read_text()


def test_forced_rebuild_backs_up_the_learner_notebook(course):
    root, lab00 = course
    edit_exercise(lab00, "0.1", "def matmul_cost(m, k, n, bytes_per_element):\n    return 1, 1")
    mine = lab00.read_text()
    build(root, "00", force=True)
    (backup,) = (root / "labs" / "backup").iterdir()
    assert backup.read_text() == mine
    assert "return 1, 1" not in lab00.read_text()


def test_an_unedited_notebook_with_outputs_is_rebuilt(course):
    root, lab00 = course
    nb = nbformat.read(lab00, as_version=4)
    nb.cells[2].outputs = [nbformat.v4.new_output("stream", text="ran it")]
    nbformat.write(nb, lab00)
    assert any("written" in m for m in build(root)), "a notebook with only outputs added was kept"
    assert "ran it" not in lab00.read_text()


def test_fresh_copy_of_one_lab_touches_nothing_else(course):
    root, lab00 = course
    before = {p: p.read_text() for p in (root / "labs").glob("*.ipynb")}
    message = fresh(root, "00")
    assert (root / "labs" / "fresh" / lab00.name).is_file() and "labs/fresh" in message
    assert [p.name for p in (root / "labs" / "fresh").iterdir()] == [lab00.name]
    assert {p: p.read_text() for p in (root / "labs").glob("*.ipynb")} == before


def test_invalid_json_fails_every_exercise_with_a_message(tmp_path):
    bad = tmp_path / LAB00.name
    bad.write_text(LAB00.read_text()[:-40])
    for outcomes in grade(bad).values():
        assert all(not o.passed and "not a valid notebook" in o.message for o in outcomes)


def test_syntax_error_names_the_cell_and_other_exercises_are_still_graded(tmp_path):
    path = tmp_path / LAB00.name
    shutil.copy(LAB00, path)
    edit_exercise(path, "0.3",
                  "def attention_cost(q_len, kv_len, heads, kv_heads, head_dim, bytes_per_element)\n    return 0")
    grades = grade(path)
    assert all(not o.passed and "(Exercise 0.3): syntax error at line 1" in o.message for o in grades["0.3"])
    assert all(o.passed for ex in ("0.1", "0.2", "0.4") for o in grades[ex])


def test_renamed_function_and_missing_exercise_are_named(tmp_path):
    path = tmp_path / LAB00.name
    shutil.copy(LAB00, path)
    edit_exercise(path, "0.2", "def roofline(flops, bytes_moved, peak_flops, bandwidth):\n    return 0")
    nb = nbformat.read(path, as_version=4)
    nb.cells = [c for c in nb.cells if c.metadata.get("exercise") != "0.4"]
    nbformat.write(nb, path)
    grades = grade(path)
    assert "defines no `roofline_time`" in grades["0.2"][0].message and "renamed" in grades["0.2"][0].message
    assert "no cell is marked as Exercise 0.4" in grades["0.4"][0].message
    assert all(o.passed for ex in ("0.1", "0.3") for o in grades[ex])


@pytest.mark.subprocess
def test_grader_run_reports_a_broken_cell_and_grades_the_rest(tmp_path):
    path = tmp_path / LAB00.name
    shutil.copy(LAB00, path)
    edit_exercise(path, "0.1", "def matmul_cost(m, k, n, bytes_per_element):\n    return (")
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--target", str(tmp_path),
                          str(ROOT / "tests" / "labs" / "test_lab00_roofline.py")],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    total = len(graded_tests(grader_module("00")))
    broken = len(graded_tests(grader_module("00"), "0.1"))
    assert f"{broken} failed, {total - broken} passed" in run.stdout, run.stdout[-2000:]
    assert "Exercise 0.1 (matmul_cost)" in run.stdout and "syntax error" in run.stdout
    assert "00   total" in run.stdout and f"{total - broken}/{total}" in run.stdout


def run_check(exercise: str, namespace: dict) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(f"check({exercise!r})", {**namespace, "check": check})
    return out.getvalue()


def test_check_reports_pass_and_the_failing_property():
    good = ("def roofline_time(flops, bytes_moved, peak_flops, bandwidth):\n"
            "    return max(flops / peak_flops, bytes_moved / bandwidth)")
    bad = ("def roofline_time(flops, bytes_moved, peak_flops, bandwidth):\n"
           "    return flops / peak_flops + bytes_moved / bandwidth")
    for source, verdict in ((good, "✅ Exercise 0.2"), (bad, "❌ Exercise 0.2")):
        namespace = {}
        exec(source, namespace)
        printed = run_check("0.2", namespace)
        assert verdict in printed, printed
    assert "exactly at the ridge" in printed and "expected" in printed


def test_endless_loop_fails_its_test_after_the_time_limit(monkeypatch):
    namespace = {}
    exec("def matmul_cost(m, k, n, bytes_per_element):\n    while True:\n        pass", namespace)
    for test in graded_tests(grader_module("00"), "0.1"):
        monkeypatch.setattr(test, "timeout", 0.5)
    outcomes = run_graded(grader_module("00"), namespace, "0.1")
    assert outcomes and all(not o.passed and "longer than 0.5 s" in o.message for o in outcomes)


def test_build_refuses_a_solution_block_outside_an_exercise_cell(tmp_path):
    (tmp_path / "solutions").mkdir()
    (tmp_path / "solutions" / "lab09_broken.py").write_text(
        "# %%\ndef f():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION\n")
    with pytest.raises(ValueError, match="no exercise="):
        build(tmp_path)
    assert json.loads((tmp_path / "solutions" / "lab09_broken.ipynb").read_text())["cells"]
