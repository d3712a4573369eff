"""The solution notebooks, each run top to bottom once per test session and kept with its outputs.

test_lab_notebooks_run.py runs them; the browser test opens the kept copies instead of running the notebooks a
second time (whichever test asks first runs it). (A plain module, not a conftest.py: modules named conftest in two
folders of one pytest process shadow each other's name; tests/app and tests/serve keep their helpers apart too.)
"""
import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[2]


def measures_on_the_real_model(source: Path) -> bool:
    """Whether solutions/<stem>.py loads SmolLM2 (labkit.REAL_MODEL): its run holds the real model, one at a time
    across xdist workers (tests/conftest.py's lock)."""
    return "REAL_MODEL" in source.read_text()


class ExecutedNotebooks:
    """solutions/<stem>.ipynb run in a real kernel, saved with its outputs in this session's pytest temporary folder
    (the one all pytest-xdist workers share: a notebook runs once however many tests and workers ask)."""

    def __init__(self, tmp_path_factory):
        from minillm.testing import run_folder  # here: the runner process (this file as a script) needs no torch
        self.folder = run_folder(tmp_path_factory) / "executed-notebooks"
        self.folder.mkdir(exist_ok=True)

    def run(self, stem: str, timeout: float) -> tuple[nbformat.NotebookNode, float]:
        """The notebook run top to bottom, once a session whichever test and worker asks first (the others wait on
        its lock, then read it): (the executed notebook, seconds). A cell that failed raises, on every call."""
        saved = self.folder / f"{stem}.ipynb"
        with open(self.folder / f"{stem}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not saved.exists():
                self._execute(stem, timeout, saved)
            nb = nbformat.read(saved, as_version=4)
        record = nb.metadata["minillm_run"]
        if record["error"]:
            raise RuntimeError(f"{stem} failed when this session ran it, after {record['seconds']:.0f} s:\n"
                               f"{record['error']}")
        return nb, record["seconds"]

    def executed(self, stem: str) -> bool:
        """Whether this session has run it already (a test that would run it first may need a lock: the real model)."""
        return (self.folder / f"{stem}.ipynb").exists()

    def path(self, stem: str, timeout: float) -> Path:
        """The executed notebook's file (run now if this session has not run it yet)."""
        self.run(stem, timeout)
        return self.folder / f"{stem}.ipynb"

    @staticmethod
    def _execute(stem: str, timeout: float, saved: Path) -> None:
        """Run it in a process of its own (this file as a script), which saves it. In the caller's process, a test
        inside a running event loop (the browser test: Playwright's sync API runs one) made nbclient start the
        kernel from a background thread, where asyncio cannot add its signal handlers: every notebook failed at
        0 s, depending only on which test asked first."""
        done = subprocess.run([sys.executable, __file__, stem, str(timeout), str(saved)], capture_output=True,
                              text=True)
        if done.returncode or not saved.exists():  # the child died before saving: keep why, for every test that asks
            nb = nbformat.read(ROOT / "solutions" / f"{stem}.ipynb", as_version=4)
            nb.metadata["minillm_run"] = {"seconds": 0.0, "error": f"the runner exited with {done.returncode}:\n"
                                                                     f"{done.stderr[-4000:]}"}
            nbformat.write(nb, saved)


def execute_and_save(stem: str, timeout: float, saved: Path) -> None:
    """Run solutions/<stem>.ipynb and save it with its outputs (up to the failure, if a cell fails) and how the run
    went."""
    nb = nbformat.read(ROOT / "solutions" / f"{stem}.ipynb", as_version=4)
    start, error = time.perf_counter(), None
    try:
        NotebookClient(nb, timeout=timeout, kernel_name="python3",
                       resources={"metadata": {"path": str(ROOT / "solutions")}}).execute()
    except Exception as e:  # noqa: BLE001  (saved, then raised by run() for every test that asks)
        error = f"{type(e).__name__}: {e}"[-4000:]
    nb.metadata["minillm_run"] = {"seconds": time.perf_counter() - start, "error": error}
    partial = saved.with_suffix(".partial")  # written whole, then renamed: no reader sees half a notebook
    nbformat.write(nb, partial)
    partial.replace(saved)


if __name__ == "__main__":
    os.environ["MINILLM_LAB_QUICK"] = "1"  # labkit.quick_run(): the kernel inherits it, and runs each experiment small
    execute_and_save(sys.argv[1], float(sys.argv[2]), Path(sys.argv[3]))
