"""Load a lab notebook's setup and exercise cells into a fresh module, without a Jupyter kernel.

The grader must not run a learner's whole notebook (plots, measurements, maybe an endless loop in
an experiment cell): it runs only the cells tagged `setup` and the exercise cells, each in order,
each on its own, so one broken cell costs only the exercises that need it. Every problem is kept
with the cell it came from and reported by the graded tests that touch it.
"""
import itertools
import json
import linecache
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path


class NotebookProblem(Exception):
    """A graded name is missing from the target notebook; the message says which and why."""


@dataclass
class LoadedNotebook:
    path: Path
    namespace: dict
    problems: dict[str, list[str]] = field(default_factory=dict)  # exercise id or "setup" -> messages
    exercises: set[str] = field(default_factory=set)               # exercise ids with a cell


_ids = itertools.count()


def load_notebook(path: Path) -> LoadedNotebook:
    path = Path(path)
    module = types.ModuleType(f"labkit_target_{path.stem}_{next(_ids)}")
    module.__file__ = str(path)
    sys.modules[module.__name__] = module  # dataclasses and pickling look their module up here
    loaded = LoadedNotebook(path, module.__dict__)
    try:
        cells = json.loads(path.read_text())["cells"]
    except FileNotFoundError:
        loaded.problems["setup"] = [f"{path} does not exist"]
        return loaded
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        loaded.problems["setup"] = [f"{path.name} is not a valid notebook ({e}); nothing in it could be graded"]
        return loaded
    for number, cell in enumerate(cells, 1):
        meta = cell.get("metadata", {}) if isinstance(cell, dict) else {}
        exercise = meta.get("exercise")
        if cell.get("cell_type") != "code" or (exercise is None and "setup" not in meta.get("tags", [])):
            continue
        key = exercise or "setup"
        label = f"cell {number} (Exercise {exercise})" if exercise else f"cell {number} (setup)"
        if exercise:
            loaded.exercises.add(exercise)
        problem = _run_cell(_source(cell), f"{path.name}, {label}", module.__dict__)
        if problem:
            loaded.problems.setdefault(key, []).append(f"{label}: {problem}")
    return loaded


def _source(cell: dict) -> str:
    source = cell.get("source", "")
    source = "".join(source) if isinstance(source, list) else source
    # IPython magics and shell escapes mean nothing outside a kernel: keep the line count, drop them.
    return "\n".join("pass  # " + line if line.lstrip().startswith(("%", "!")) else line
                     for line in source.splitlines())


def _run_cell(source: str, filename: str, namespace: dict) -> str | None:
    """Execute one cell; -> None, or what went wrong in words."""
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)  # for tracebacks
    try:
        code = compile(source, filename, "exec")
    except SyntaxError as e:
        return f"syntax error at line {e.lineno}: {e.msg}"
    try:
        exec(code, namespace)
    except Exception as e:  # a learner's cell may raise anything; report it, grade the rest
        return f"running it raised {type(e).__name__}: {e}"
    return None


class Lab:
    """What a graded test sees: the target's definitions (`lab.rms_norm`). A missing name raises
    NotebookProblem naming the exercise and the reasons the loader found."""

    def __init__(self, namespace: dict, exercise: str, problems: dict[str, list[str]] | None = None,
                 exercises: set[str] | None = None, where: str = "the notebook") -> None:
        self._namespace, self._exercise, self._where = namespace, exercise, where
        self._problems, self._exercises = problems or {}, exercises

    def __getattr__(self, name: str):
        try:
            return self._namespace[name]
        except KeyError:
            pass
        reasons = self._problems.get(self._exercise, []) + self._problems.get("setup", [])
        if self._exercises is not None and self._exercise not in self._exercises:
            lab = self._exercise.split(".")[0].zfill(2)
            reasons.append(f"no cell is marked as Exercise {self._exercise} (deleted? a fresh copy of the "
                           f"lab: python -m minillm.labkit fresh {lab})")
        if not reasons:
            reasons.append("renamed? the grader looks for the name and signature the exercise gives")
        raise NotebookProblem(f"Exercise {self._exercise}: {self._where} defines no `{name}`: "
                              + "; ".join(reasons))
