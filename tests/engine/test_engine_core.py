"""The engine core (engine/engine.py) stays a core: the step loop, requests in and out, observers.
Its views, the KV offload tier and the prefill hand-off live in parts of their own (issue 48)."""
import ast
from pathlib import Path

import minillm.engine.engine as engine_module

MAX_CORE_METHODS = 12


def test_the_engine_core_keeps_at_most_twelve_methods_of_its_own():
    """Every def in LLMEngine's body counts, properties and private helpers too: a new read-only
    view goes to engine_view.py, a new face to a part of its own, not onto the core."""
    tree = ast.parse(Path(engine_module.__file__).read_text())
    engine = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "LLMEngine")
    methods = [n.name for n in engine.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    assert len(methods) <= MAX_CORE_METHODS, f"LLMEngine has {len(methods)} methods: {methods}"
