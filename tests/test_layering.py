"""The package's layers depend one way (model <- cache <- engine <- facade <- app, bench, labs), and
nothing outside the engine reads its internals: observers use StepEvents and the public methods."""
import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "minillm"


def imports(path: Path) -> set[str]:
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


def modules_under(folder: str) -> list[Path]:
    return sorted((PACKAGE / folder).rglob("*.py"))


@pytest.mark.parametrize("layer, forbidden", [
    ("layers", ("minillm.models", "minillm.cache", "minillm.engine", "minillm.llm")),
    ("models", ("minillm.cache", "minillm.engine", "minillm.llm")),
    ("cache", ("minillm.engine", "minillm.llm", "minillm.async_llm")),
    ("engine", ("minillm.llm", "minillm.async_llm", "minillm.bench", "minillm.labkit")),
    ("perf", ("minillm.bench", "minillm.engine", "minillm.llm")),
])
def test_layers_depend_one_way(layer, forbidden):
    wrong = {f"{p.relative_to(ROOT)} imports {m}" for p in modules_under(layer) for m in imports(p)
             if m.startswith(forbidden)}
    assert not wrong, sorted(wrong)


QUANT_CORE = ("codecs.py", "config.py", "linear.py", "apply.py", "checkpoint.py")


def test_the_quantized_layers_sit_below_the_model_loader():
    """The loader builds quantized models, so the codecs, the layer, the policy and the checkpoint
    format import nothing of models, cache or engine (the measurements in quant/ may)."""
    wrong = {f"quant/{name} imports {m}" for name in QUANT_CORE for m in imports(PACKAGE / "quant" / name)
             if m.startswith(("minillm.models", "minillm.cache", "minillm.engine", "minillm.llm", "minillm.config"))}
    assert not wrong, sorted(wrong)


def test_shared_state_types_import_nothing_of_the_package():
    assert imports(PACKAGE / "state.py") == set()


def test_the_scheduler_takes_nothing_from_the_runner():
    assert "minillm.engine.runner" not in imports(PACKAGE / "engine" / "scheduler.py")


INTERNALS = re.compile(r"\.(scheduler|cache_manager)\.|(?<!minillm\.)\bengine\.(cache|runner|scheduler)\b")


def test_nothing_outside_the_engine_reads_its_internals():
    """The app, benchmarks, labs, tests and the rest of the package use StepEvents and the
    engine's public methods (kv_stats, sequences, num_waiting, ...), not its scheduler or cache."""
    outside = [p for p in ROOT.glob("**/*.py") if ".venv" not in p.parts and "negatives" not in p.parts
               and not p.is_relative_to(PACKAGE / "engine") and not p.is_relative_to(PACKAGE / "cache")
               and p != Path(__file__)]
    hits = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}" for p in outside
            for i, line in enumerate(p.read_text().splitlines(), 1) if INTERNALS.search(line)]
    assert not hits, "\n".join(hits)
