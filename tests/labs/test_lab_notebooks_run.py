"""Every solution notebook runs top to bottom in a real kernel, headless, within its time budget,
and every inline check() in it passes. The executed notebooks are kept for the browser test."""
import re
from pathlib import Path

import pytest
from executed_notebooks import ExecutedNotebooks

from minillm.labkit.notebook import lab_sources

ROOT = Path(__file__).resolve().parents[2]
BUDGET_S = 180


@pytest.mark.timeout(BUDGET_S + 60)
@pytest.mark.parametrize("source", lab_sources(ROOT), ids=lambda p: p.stem)
def test_solution_notebook_runs_within_budget_and_its_checks_pass(source, tmp_path_factory):
    nb, elapsed = ExecutedNotebooks(tmp_path_factory).run(source.stem, timeout=BUDGET_S)
    assert elapsed < BUDGET_S, f"{source.stem} took {elapsed:.0f} s, over its {BUDGET_S} s budget"
    printed = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    # cells that call check("N.K") (not a method named check, as lab 08's LoopBreaker has)
    checks = [c for c in nb.cells if c.cell_type == "code" and re.search(r'^check\("', c.source, re.M)]
    assert "❌" not in printed, f"a check() failed while running {source.stem}:\n{printed}"
    passed = printed.count("✅")
    assert passed == len(checks), f"{source.stem}: {len(checks)} check cells, {passed} passed"
