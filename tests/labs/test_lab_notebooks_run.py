"""Every solution notebook runs top to bottom in a real kernel, headless, within its time budget,
and every inline check() in it passes."""
import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from minillm.labkit.notebook import lab_sources

ROOT = Path(__file__).resolve().parents[2]
BUDGET_S = 180


@pytest.mark.timeout(BUDGET_S + 60)
@pytest.mark.parametrize("source", lab_sources(ROOT), ids=lambda p: p.stem)
def test_solution_notebook_runs_within_budget_and_its_checks_pass(source):
    nb = nbformat.read(ROOT / "solutions" / f"{source.stem}.ipynb", as_version=4)
    start = time.perf_counter()
    NotebookClient(nb, timeout=BUDGET_S, kernel_name="python3",
                   resources={"metadata": {"path": str(ROOT / "solutions")}}).execute()
    elapsed = time.perf_counter() - start
    assert elapsed < BUDGET_S, f"{source.stem} took {elapsed:.0f} s, over its {BUDGET_S} s budget"
    printed = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    checks = [c for c in nb.cells if c.cell_type == "code" and "check(" in c.source]
    assert "❌" not in printed, f"a check() failed while running {source.stem}:\n{printed}"
    assert printed.count("✅") == len(checks), f"{source.stem}: {len(checks)} check cells, {printed.count('✅')} passed"
