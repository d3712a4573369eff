"""`make progress`: every lab's exercises, passed, failing or not started, and the next one to do."""
import json
import shutil
from pathlib import Path

from minillm.labkit.progress import FAILING, NOT_STARTED, PASSED, lab_progress, next_exercise, report

ROOT = Path(__file__).resolve().parents[2]


def learner_notebook_with(tmp_path: Path, sources: dict[str, str]) -> Path:
    """labs/lab00_*.ipynb copied into tmp_path, with the cells of the given exercises replaced."""
    (original,) = (ROOT / "labs").glob("lab00_*.ipynb")
    path = tmp_path / original.name
    nb = json.loads(original.read_text())
    for cell in nb["cells"]:
        exercise = cell.get("metadata", {}).get("exercise")
        if exercise in sources:
            cell["source"] = sources[exercise]
    path.write_text(json.dumps(nb))
    return path


def solution_cell(exercise: str) -> str:
    (solution,) = (ROOT / "solutions").glob("lab00_*.ipynb")
    cells = json.loads(solution.read_text())["cells"]
    return "".join(next(c["source"] for c in cells if c.get("metadata", {}).get("exercise") == exercise))


def test_a_fresh_notebook_is_not_started_and_its_first_exercise_is_next(tmp_path):
    path = learner_notebook_with(tmp_path, {})
    rows = lab_progress(path)
    assert rows and all(r.status == NOT_STARTED for r in rows)
    assert next_exercise(rows).exercise == rows[0].exercise == "0.1"


def test_a_solved_exercise_passes_a_wrong_one_fails_and_the_next_is_the_first_not_passed(tmp_path):
    wrong = solution_cell("0.2").replace("max(", "min(")
    assert wrong != solution_cell("0.2")
    path = learner_notebook_with(tmp_path, {"0.1": solution_cell("0.1"), "0.2": wrong})
    status = {r.exercise: r for r in lab_progress(path)}
    assert status["0.1"].status == PASSED
    assert status["0.2"].status == FAILING and "checks fail" in status["0.2"].detail
    assert status["0.3"].status == NOT_STARTED
    assert next_exercise(list(status.values())).exercise == "0.2"


def test_the_report_names_every_lab_in_the_folder_and_the_next_exercise(tmp_path):
    learner_notebook_with(tmp_path, {"0.1": solution_cell("0.1")})
    (other,) = (ROOT / "labs").glob("lab03_*.ipynb")
    shutil.copy(other, tmp_path / other.name)
    text = report(tmp_path)
    assert "lab 00: 1 of" in text and "lab 03: 0 of" in text
    assert text.splitlines()[-1] == "Next: exercise 0.2 (lab 00, not started)."


def test_an_empty_folder_says_how_to_get_the_notebooks(tmp_path):
    assert "make labs" in report(tmp_path)
