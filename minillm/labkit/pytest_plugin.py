"""The lab grader's pytest plugin (loaded with `-p minillm.labkit.pytest_plugin` from pyproject.toml).

    pytest tests/labs --target labs        grade the learner notebooks in labs/ (make grade LAB=NN)
    pytest tests/labs                      grade the reference in solutions/ (what make test runs)
    pytest tests/labs --target some/dir    grade the labNN_*.ipynb found in a folder

It provides the `lab` fixture, shortens failures of learner work to the exercise and the property
that failed, and ends the run with a gradebook: one row per exercise, one point per passing test.
Each test's grade travels on its report (`user_properties`), so the gradebook is whole when
pytest-xdist runs the tests in workers and only the controller writes the summary.
"""
from pathlib import Path

import pytest

from minillm.labkit.cell_loader import Lab, load_notebook
from minillm.labkit.grading import describe, lab_of, property_of

NOTEBOOKS = pytest.StashKey[dict]()
GRADES = pytest.StashKey[dict]()
PROBLEM_LINES = pytest.StashKey[dict]()


def pytest_addoption(parser):
    parser.addoption("--target", default="solutions",
                     help="lab notebooks to grade: labs (yours), solutions (the reference), or a folder")


def pytest_configure(config):
    config.addinivalue_line("markers", "exercise(id): a graded test of lab exercise `id`, e.g. '1.3'")
    config.stash[NOTEBOOKS], config.stash[GRADES], config.stash[PROBLEM_LINES] = {}, {}, {}
    config.pluginmanager.register(Gradebook(config), "minillm-gradebook")


def target_dir(config) -> Path:
    target = config.getoption("target")
    return config.rootpath / target if target in ("labs", "solutions") else Path(target)


@pytest.fixture
def lab(request) -> Lab:
    """The target notebook's definitions for this test's exercise."""
    marker = request.node.get_closest_marker("exercise")
    if marker is None:
        raise pytest.UsageError(f"{request.node.nodeid} uses `lab` without @exercise(...)")
    exercise = marker.args[0]
    folder = target_dir(request.config)
    found = sorted(folder.glob(f"lab{lab_of(exercise)}_*.ipynb"))
    path = found[0] if found else folder / f"lab{lab_of(exercise)}_(missing).ipynb"
    cache = request.config.stash[NOTEBOOKS]
    if path not in cache:
        cache[path] = load_notebook(path)
    loaded = cache[path]
    return Lab(loaded.namespace, exercise, loaded.problems, loaded.exercises, path.name)


GRADE, PROBLEMS = "minillm-grade", "minillm-notebook-problems"  # keys of a report's user_properties


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    marker = item.get_closest_marker("exercise")
    if marker is None or report.when not in ("setup", "call") or (report.when == "setup" and report.passed):
        return
    exercise = marker.args[0]
    title = getattr(item.module, "EXERCISES", {}).get(exercise, "")
    report.user_properties.append((GRADE, (lab_of(exercise), exercise, title, report.passed)))
    problems = [f"problem in {loaded.path.name}: {message}" for loaded in item.config.stash[NOTEBOOKS].values()
                for messages in loaded.problems.values() for message in messages]
    report.user_properties.append((PROBLEMS, problems))
    if report.failed and call.excinfo is not None and item.config.getoption("target") != "solutions":
        report.longrepr = (f"Exercise {exercise} ({title}): {property_of(item.function)}\n"
                           f"  {describe(call.excinfo.value)}")


class Gradebook:
    """Tallies the graded tests in the process that writes the summary (the only one, or xdist's controller)."""

    def __init__(self, config):
        self.grades, self.problems = config.stash[GRADES], config.stash[PROBLEM_LINES]

    def pytest_runtest_logreport(self, report):
        for key, value in report.user_properties:
            if key == GRADE:
                lab, exercise, title, passed = value
                row = self.grades.setdefault((lab, exercise), [title, 0, 0])
                row[1] += passed
                row[2] += 1
            elif key == PROBLEMS:
                self.problems.update(dict.fromkeys(value))  # an ordered set


def pytest_terminal_summary(terminalreporter, config):
    grades = config.stash[GRADES]
    if not grades:
        return
    write = terminalreporter.write_line
    terminalreporter.section(f"gradebook ({target_dir(config)})")
    write(f"{'lab':<4} {'exercise':<9} {'':<34} {'result':<7} points")
    labs: dict[str, list[int]] = {}
    for (lab, exercise), (title, passed, total) in sorted(grades.items(), key=lambda kv: _order(kv[0])):
        write(f"{lab:<4} {exercise:<9} {title[:34]:<34} {'pass' if passed == total else 'FAIL':<7} {passed}/{total}")
        sums = labs.setdefault(lab, [0, 0])
        sums[0], sums[1] = sums[0] + passed, sums[1] + total
    for lab, (passed, total) in sorted(labs.items()):
        write(f"{lab:<4} {'total':<9} {'':<34} {'':<7} {passed}/{total}")
    for problem in config.stash[PROBLEM_LINES]:
        write(problem)
    if config.getoption("target") != "solutions":
        upcoming = next(((lab, exercise) for (lab, exercise), (_, passed, total) in
                         sorted(grades.items(), key=lambda kv: _order(kv[0])) if passed < total), None)
        write("Every exercise graded here passes. Well done!" if upcoming is None else
              f"Next: exercise {upcoming[1]} (lab {upcoming[0]}). `make progress` shows every lab.")


def _order(key):
    """Exercises in number order; a lab's end-to-end row ("3.E") after them."""
    lab, exercise = key
    return lab, tuple(int(p) if p.isdigit() else float("inf") for p in exercise.split("."))
