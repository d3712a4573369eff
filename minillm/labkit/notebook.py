"""From one lab source to two notebooks: the complete solution and the learner's exercise copy.

A lab is written once, as a jupytext `py:percent` file in solutions/. Its cells carry metadata in
the `# %%` header line:

    # %% tags=["setup"]         imports and constants the exercises need (the grader runs these)
    # %% exercise="1.3"         an exercise cell: one function or class, solution bodies between
                                ### BEGIN SOLUTION and ### END SOLUTION

The learner copy replaces each solution body with `raise NotImplementedError("Exercise 1.3: ...")`
and records a fingerprint of the stub, so a later rebuild can tell whether the learner has
written in that cell (see build.py).
"""
import ast
import hashlib
import re
from pathlib import Path

import jupytext
import nbformat

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
KERNELSPEC = {"name": "python3", "display_name": "Python 3", "language": "python"}


def read_source(path: Path) -> nbformat.NotebookNode:
    """The py:percent lab source -> a notebook with fixed cell ids and no jupytext bookkeeping,
    so the same source always gives byte-identical notebooks."""
    nb = jupytext.read(path, fmt="py:percent")
    nb.metadata = {"kernelspec": dict(KERNELSPEC), "language_info": {"name": "python"}}
    for i, cell in enumerate(nb.cells):
        cell.id = f"cell-{i:02d}"
        cell.metadata.pop("lines_to_next_cell", None)
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    return nb


def fingerprint(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def learner_copy(solution: nbformat.NotebookNode, name: str) -> nbformat.NotebookNode:
    """The learner's notebook: every solution body replaced by a stub that names the task."""
    nb = nbformat.from_dict(solution)
    for i, cell in enumerate(nb.cells):
        exercise = cell.metadata.get("exercise")
        if cell.cell_type != "code" or exercise is None:
            if BEGIN in cell.source:
                raise ValueError(f"{name}: cell {i} has a {BEGIN} marker but no exercise=\"N.K\" in its header")
            continue
        cell.source = strip_solutions(cell.source, exercise, f"{name} cell {i}")
        cell.metadata["labkit"] = {"stub": fingerprint(cell.source)}
    return nb


def strip_solutions(source: str, exercise: str, where: str) -> str:
    """Replace each BEGIN..END block by a NotImplementedError at the marker's indentation."""
    lines, out, inside = source.splitlines(), [], None
    tasks = _tasks(source, exercise, where)
    for number, line in enumerate(lines, 1):
        marker = line.strip()
        if marker == BEGIN:
            if inside is not None:
                raise ValueError(f"{where}: {BEGIN} at line {number} inside another solution block")
            inside = number
            indent = line[:len(line) - len(line.lstrip())]
            out.append(f"{indent}raise NotImplementedError({tasks[number]!r})")
        elif marker == END:
            if inside is None:
                raise ValueError(f"{where}: {END} at line {number} without a {BEGIN}")
            inside = None
        elif inside is None:
            out.append(line)
    if inside is not None:
        raise ValueError(f"{where}: {BEGIN} at line {inside} is never closed by {END}")
    if len(out) == len(lines):
        raise ValueError(f"{where}: exercise {exercise} has no {BEGIN} / {END} block")
    return "\n".join(out)


def _tasks(source: str, exercise: str, where: str) -> dict[int, str]:
    """Line of each BEGIN marker -> 'Exercise N.K: <qualified name> - <docstring summary>'."""
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise ValueError(f"{where}: the solution does not parse: {e}") from None
    defs = []  # (first line, last line, qualified name, docstring summary)

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.ClassDef)):
                qual = f"{prefix}{child.name}"
                summary = (ast.get_docstring(child) or "").strip().split("\n")[0]
                defs.append((child.lineno, child.end_lineno, qual, summary))
                visit(child, qual + ".")

    visit(tree, "")
    tasks = {}
    for number, line in enumerate(source.splitlines(), 1):
        if line.strip() == BEGIN:
            inner = [d for d in defs if d[0] <= number <= d[1]]
            if not inner:
                raise ValueError(f"{where}: {BEGIN} at line {number} is not inside a function")
            _, _, qual, summary = max(inner, key=lambda d: d[0])
            summary = summary or next((d[3] for d in reversed(inner) if d[3]), "")
            tasks[number] = f"Exercise {exercise}: {qual}" + (f" - {summary}" if summary else "")
    return tasks


def lab_sources(root: Path) -> list[Path]:
    """solutions/labNN_<slug>.py, in lab order."""
    return sorted(p for p in (root / "solutions").glob("lab*.py") if re.fullmatch(r"lab\d\d_\w+", p.stem))


def to_json(nb: nbformat.NotebookNode) -> str:
    return nbformat.writes(nb) + "\n"
