"""`make labs`: write solutions/labNN_*.ipynb and the learner notebooks labs/labNN_*.ipynb.

labs/ is where learners write, so a rebuild never destroys their work: a learner notebook whose
exercise cells differ from the stubs it was generated with is left alone, and the new version goes
to labs/fresh/ instead. `--force` replaces it anyway, after keeping a copy in labs/backup/.
"""
import json
import shutil
import time
from pathlib import Path

import nbformat

from minillm.labkit.notebook import fingerprint, lab_sources, learner_copy, read_source, to_json


def build(root: Path, lab: str | None = None, force: bool = False) -> list[str]:
    """Regenerate every lab (or only lab `lab`, e.g. "01"); -> one line per notebook written or kept."""
    messages = []
    for source in _sources(root, lab):
        solution = read_source(source)
        _write(root / "solutions" / f"{source.stem}.ipynb", to_json(solution))
        learner = to_json(learner_copy(solution, source.stem))
        target = root / "labs" / f"{source.stem}.ipynb"
        edited = edited_exercises(target) if target.exists() else []
        if edited and not force:
            fresh = _write(root / "labs" / "fresh" / target.name, learner)
            messages.append(
                f"{_rel(target, root)}: not overwritten, you have written in {', '.join(edited)}.\n"
                f"  A fresh copy is at {_rel(fresh, root)}.\n"
                f"  To replace yours with it: python -m minillm.labkit build --lab {source.stem[3:5]} --force"
                f" (yours is then kept in labs/backup/).")
            continue
        if edited:
            backup = root / "labs" / "backup" / f"{source.stem}-{time.strftime('%Y%m%d-%H%M%S')}.ipynb"
            backup.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(target, backup)
            messages.append(f"{_rel(target, root)}: your version is kept in {_rel(backup, root)}")
        changed = not target.exists() or target.read_text() != learner
        _write(target, learner)
        messages.append(f"{_rel(target, root)}: {'written' if changed else 'up to date'}")
    return messages


def fresh(root: Path, lab: str) -> str:
    """Write a fresh learner copy of one lab to labs/fresh/, touching nothing else."""
    (source,) = _sources(root, lab)
    path = _write(root / "labs" / "fresh" / f"{source.stem}.ipynb",
                  to_json(learner_copy(read_source(source), source.stem)))
    return f"fresh copy of lab {lab}: {_rel(path, root)}"


def edited_exercises(path: Path) -> list[str]:
    """Exercises of a learner notebook whose cells no longer hold the stub they were generated
    with (or ['the whole notebook'] when it cannot be read: that is someone's work too)."""
    try:
        nb = nbformat.reads(path.read_text(), as_version=4)
    except (OSError, json.JSONDecodeError, nbformat.reader.NotJSONError, ValueError):
        return ["the whole notebook (it is not valid notebook JSON)"]
    edited = []
    for cell in nb.cells:
        exercise = cell.get("metadata", {}).get("exercise")
        stub = cell.get("metadata", {}).get("labkit", {}).get("stub")
        if exercise is not None and stub != fingerprint(cell.source):
            edited.append(f"exercise {exercise}")
    return edited


def _sources(root: Path, lab: str | None) -> list[Path]:
    sources = lab_sources(root)
    if not sources:
        raise SystemExit(f"no lab sources (solutions/labNN_<slug>.py) under {root.resolve()}: "
                         "run this from the repository root")
    if lab is None:
        return sources
    picked = [s for s in sources if s.stem[3:5] == lab.zfill(2)]
    if not picked:
        raise SystemExit(f"no lab {lab!r}; the labs are {', '.join(s.stem[3:5] for s in sources)}")
    return picked


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return path


def _rel(path: Path, root: Path) -> str:
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)
