"""Where a learner stands in the course: every lab's exercises, passed, failing or not started, and the next one.

    make progress        (python -m minillm.labkit progress)   all the labs in labs/
    make grade LAB=NN    ends with the same line for that lab: the next exercise to do

An exercise whose cell still holds the stub it was generated with is "not started" without running anything;
every other one runs its graded tests, as `check()` does in the notebook (a failing test is "failing", with the
count). The next exercise is the first, in course order, that is not passed.
"""
from dataclasses import dataclass
from pathlib import Path

from minillm.labkit.build import edited_exercises
from minillm.labkit.cell_loader import load_notebook
from minillm.labkit.grading import graded_tests, grader_module, run_graded

PASSED, FAILING, NOT_STARTED = "passed", "failing", "not started"


@dataclass(frozen=True)
class ExerciseStatus:
    lab: str
    exercise: str
    status: str
    detail: str = ""  # for a failing exercise: how many of its checks fail


def lab_progress(path: Path) -> list[ExerciseStatus]:
    """The status of each graded exercise of one learner notebook (labNN_<topic>.ipynb), in exercise order."""
    lab = path.name[3:5]
    module = grader_module(lab)
    exercises = sorted({fn.exercise for fn in graded_tests(module)}, key=_order)
    edited = {e.removeprefix("exercise ") for e in edited_exercises(path)}
    loaded = load_notebook(path) if edited else None
    rows = []
    for exercise in exercises:
        # an end-to-end test (N.E) runs the learner's parts together: started once any of them is
        started = exercise in edited or (exercise.endswith(".E") and bool(edited))
        if not started:
            rows.append(ExerciseStatus(lab, exercise, NOT_STARTED))
            continue
        outcomes = run_graded(module, loaded.namespace, exercise, loaded.problems, loaded.exercises, path.name)
        failed = [o for o in outcomes if not o.passed]
        if not failed:
            rows.append(ExerciseStatus(lab, exercise, PASSED))
        elif all(o.message.startswith("not implemented yet") for o in outcomes):
            rows.append(ExerciseStatus(lab, exercise, NOT_STARTED))
        else:
            rows.append(ExerciseStatus(lab, exercise, FAILING, f"{len(failed)} of {len(outcomes)} checks fail"))
    return rows


def next_exercise(rows: list[ExerciseStatus]) -> ExerciseStatus | None:
    """The first exercise, in course order, that is not passed; None when every one is."""
    return next((r for r in rows if r.status != PASSED), None)


def report(folder: Path) -> str:
    """The progress table of every lab notebook in `folder`, and the next exercise to do."""
    notebooks = sorted(folder.glob("lab[0-9][0-9]_*.ipynb"))
    if not notebooks:
        return f"no lab notebooks (labNN_<topic>.ipynb) in {folder}: run `make labs` to write them"
    rows = [row for path in notebooks for row in lab_progress(path)]
    lines = [f"{'lab':<4} {'exercise':<9} status"]
    for row in rows:
        mark = {PASSED: "✅", FAILING: "❌", NOT_STARTED: "·"}[row.status]
        lines.append(f"{row.lab:<4} {row.exercise:<9} {mark} {row.status}{f' ({row.detail})' if row.detail else ''}")
    for lab in sorted({r.lab for r in rows}):
        mine = [r for r in rows if r.lab == lab]
        lines.append(f"lab {lab}: {sum(r.status == PASSED for r in mine)} of {len(mine)} passed")
    lines.append(next_line(rows))
    return "\n".join(lines)


def next_line(rows: list[ExerciseStatus]) -> str:
    upcoming = next_exercise(rows)
    if upcoming is None:
        return "Every exercise passes. Well done!"
    return f"Next: exercise {upcoming.exercise} (lab {upcoming.lab}, {upcoming.status})."


def _order(exercise: str):
    return tuple(int(p) if p.isdigit() else float("inf") for p in exercise.split("."))
