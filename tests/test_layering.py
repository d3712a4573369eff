"""The package's layers depend one way (docs/design.md), and the rules an import contract cannot state.

The layers themselves are import-linter contracts in pyproject.toml ([tool.importlinter], run by
`make lint`); each contract runs here too, so a broken one fails the suite with import-linter's own
account of the offending import chain. What stays hand-written: what a module leaves in
sys.modules at run time, and who reads the engine's internals."""
import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: import-linter brings tomli
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "minillm"
CONTRACTS = [c["id"] for c in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]]

def run_python(*args: str) -> subprocess.CompletedProcess:
    """`python ARGS` in a fresh interpreter that imports this checkout's minillm."""
    return subprocess.run([sys.executable, *args], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=300)


@pytest.mark.subprocess
@pytest.mark.parametrize("contract", CONTRACTS)
def test_import_contract_is_kept(contract):
    lint = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    run = run_python("-c", lint, "--no-cache", "--no-logo", "--contract", contract)
    assert run.returncode == 0, run.stdout + run.stderr


ROUTER_MODULES = ["minillm.router.policies", "minillm.router.prefix_index", "minillm.router.replica_state",
                  "minillm.router.replica_metrics", "minillm.router.proxy", "minillm.router.fleet"]


@pytest.mark.subprocess
def test_the_router_and_its_command_import_without_simpy():
    """`minillm route` needs the serve extra, not the simulator's: with SimPy made unimportable, every
    router module and the CLI's route path (cli._route imports router.fleet) still import."""
    code = f"""
import sys
sys.modules["simpy"] = None  # now `import simpy` raises ImportError, as where SimPy is not installed
for name in {ROUTER_MODULES!r} + ["minillm.cli"]:
    __import__(name)
from minillm.router.fleet import Fleet, route_in_thread
print(sorted(m for m in sys.modules if m.startswith("minillm.sim")))
"""
    run = run_python("-c", code)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]", f"the router loaded the simulator: {run.stdout}"


HEAVY = ("minillm.training", "minillm.experiments")


@pytest.mark.subprocess
def test_importing_the_engine_loads_no_training_evaluation_or_model_card_code():
    code = f"import sys, minillm.engine.engine; print(sorted(m for m in sys.modules if m.startswith({HEAVY!r})))"
    run = run_python("-c", code)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]", f"importing the engine loaded {run.stdout.strip()}"


@pytest.mark.subprocess
def test_loading_a_model_imports_no_compiler():
    """A model is built on the meta device; an operator run on a meta tensor there (an initial weight drawn, a
    rotary table, Module.to_empty) would import torch._dynamo and sympy: 1.5-2 s in every process that loads one."""
    code = ("import sys; from minillm import LLM; LLM('tiny'); "
            "print(sorted(m for m in ('torch._dynamo', 'torch._inductor', 'sympy') if m in sys.modules))")
    run = run_python("-c", code)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]", f"loading a model imported {run.stdout.strip()}"


def runtime_imports(path: Path) -> set[str]:
    """The minillm modules a file imports at run time (imports under `if TYPE_CHECKING:` excluded)."""
    tree = ast.parse(path.read_text())
    type_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                 and getattr(node.test, "id", None) == "TYPE_CHECKING" for n in ast.walk(node)}
    found = set()
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("minillm"):
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("minillm")}
    return found


def test_the_sequence_types_import_nothing_of_the_package():
    assert runtime_imports(PACKAGE / "sequence.py") == set()


def test_the_scheduler_takes_nothing_from_the_runner():
    assert "minillm.engine.runner" not in runtime_imports(PACKAGE / "engine" / "scheduler.py")


# config.scheduler is EngineConfig's SchedulerConfig (settings anyone may read), not the engine's Scheduler.
INTERNALS = re.compile(r"(?<!config)\.(scheduler|cache_manager)\.|(?<!minillm\.)\bengine\.(cache|runner|scheduler)\b")


def test_nothing_outside_the_engine_reads_its_internals():
    """The app, benchmarks, labs, tests and the rest of the package use StepEvents and the engine's
    public faces (engine.view, engine.kv_offload, engine.handoff), not its scheduler or cache."""
    outside = [p for p in ROOT.glob("**/*.py") if ".venv" not in p.parts and "negatives" not in p.parts
               and not p.is_relative_to(PACKAGE / "engine") and not p.is_relative_to(PACKAGE / "cache")
               and p != Path(__file__)]
    hits = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}" for p in outside
            for i, line in enumerate(p.read_text().splitlines(), 1) if INTERNALS.search(line)]
    assert not hits, "\n".join(hits)


def test_no_two_modules_share_a_file_name():
    """A name says one thing: `spec.py` cannot be a benchmark in one folder and a grammar in another. Package
    markers (`__init__.py`, `__main__.py`) aside, every source file of the package has a name of its own."""
    seen: dict[str, list[str]] = {}
    for path in PACKAGE.rglob("*"):
        if path.suffix in (".py", ".cpp", ".h") and path.name not in ("__init__.py", "__main__.py"):
            seen.setdefault(path.name, []).append(str(path.relative_to(PACKAGE)))
    shared = {name: paths for name, paths in seen.items() if len(paths) > 1}
    assert not shared, f"file names used twice or more: {shared}"


def test_the_tests_mirror_the_package():
    """tests/NAME/ holds the tests of minillm/NAME/ (tests/labs and tests/app: the labs and the visualizer,
    which live outside the package); the tests of minillm's top-level modules sit in tests/ itself."""
    folders = {p.name for p in (ROOT / "tests").iterdir() if p.is_dir() and p.name != "__pycache__"}
    strays = folders - {p.name for p in PACKAGE.iterdir() if p.is_dir()} - {"labs", "app"}
    assert not strays, f"test folders with no package folder of that name: {sorted(strays)}"
