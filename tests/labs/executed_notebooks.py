"""The solution notebooks, each run top to bottom once per test session and kept with its outputs.

test_lab_notebooks_run.py runs them; the browser test opens the kept copies instead of running the notebooks a
second time. (A plain module, not a conftest.py: the tests in tests/app import their conftest by name, and a second
conftest.py loaded after theirs would shadow it.)
"""
import os
import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[2]


def each_notebook(sources: list[Path]) -> list:
    """The parameters of a test per solution notebook. Under pytest-xdist a lab's run and its browser test go to
    the same worker (one xdist_group), so the browser opens the notebook that worker ran, after it ran."""
    return [pytest.param(s, id=s.stem, marks=pytest.mark.xdist_group(f"notebook-{s.stem}")) for s in sources]


class ExecutedNotebooks:
    """solutions/<stem>.ipynb run in a real kernel, saved with its outputs in this session's pytest temporary folder
    (the one all pytest-xdist workers share, so the browser test finds a notebook another worker ran)."""

    def __init__(self, tmp_path_factory):
        base = tmp_path_factory.getbasetemp()
        shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # workers: <session>/popen-gwN
        self.folder = shared / "executed-notebooks"
        self.folder.mkdir(exist_ok=True)

    def run(self, stem: str, timeout: float) -> tuple[nbformat.NotebookNode, float]:
        """Run the notebook top to bottom: (the executed notebook, seconds). Saved even when a cell fails,
        with the outputs up to the failure."""
        nb = nbformat.read(ROOT / "solutions" / f"{stem}.ipynb", as_version=4)
        start = time.perf_counter()
        try:
            NotebookClient(nb, timeout=timeout, kernel_name="python3",
                           resources={"metadata": {"path": str(ROOT / "solutions")}}).execute()
            return nb, time.perf_counter() - start
        finally:  # written whole, then renamed: a reader in another worker never sees half a notebook
            partial = self.folder / f"{stem}.{os.getpid()}.partial"
            nbformat.write(nb, partial)
            partial.replace(self.folder / f"{stem}.ipynb")

    def path(self, stem: str, timeout: float) -> Path:
        """The executed notebook: this session's run when there was one, else a run now."""
        saved = self.folder / f"{stem}.ipynb"
        if not saved.exists():
            self.run(stem, timeout)
        return saved
