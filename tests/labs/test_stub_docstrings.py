"""The learner derives the formula; the stub states the contract. No exercise's docstring (nor a docstring of
a method in an exercise's class) may hold an expression that computes a result from the function's own
parameters: `bytes_per_param * num_params`, `max(flops / peak, bytes / bandwidth)`, `x ** 2`. Shapes,
units, edge cases and errors are the contract and stay (`[num_tokens, hidden]`, `tokens/s`).

A docstring may still name an operation the exercise does not teach (a Triton kernel of an operation
defined elsewhere): mark such a line with `(definition)` at its end, and say why in the line."""
import ast
import re
from pathlib import Path

import pytest

from minillm.labkit.notebook import read_source

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted((ROOT / "solutions").glob("lab*_*.py"))
OPERATOR = r"(?:\*\*|//|[-+*/%@])"
CALLS = r"(?:max|min|sqrt|exp|log|log2|sum|mean|ceil|floor|round|abs|cdiv|softmax|clamp)"


def exercise_functions(path: Path):
    """(exercise id, function name, parameter names, docstring) of every function an exercise cell defines,
    methods of its classes included."""
    for cell in read_source(path).cells:
        exercise = cell.metadata.get("exercise")
        if cell.cell_type != "code" or exercise is None:
            continue
        for node in ast.walk(ast.parse(cell.source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and ast.get_docstring(node):
                args = node.args
                names = [a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs] if a.arg != "self"]
                if args.vararg:
                    names.append(args.vararg.arg)
                yield exercise, node.name, names, ast.get_docstring(node)


def formula_lines(params: list[str], docstring: str) -> list[str]:
    """The docstring's lines that compute with a parameter: an operator beside it, or a math call over it."""
    found = []
    for line in docstring.splitlines():
        if line.rstrip().endswith("(definition)"):
            continue
        for name in params:
            p = re.escape(name)
            arithmetic = (rf"\b{p}\b\s*{OPERATOR}\s*[\w(\[.]", rf"[\w)\].]\s*{OPERATOR}\s*\b{p}\b(?!\s*[:=])")
            call = rf"\b{CALLS}\([^)]*\b{p}\b"
            if any(re.search(rx, line) for rx in (*arithmetic, call)):
                found.append(line.strip())
                break
    return found


def test_the_check_finds_a_formula_and_passes_a_contract():
    assert formula_lines(["n", "d"], "-> the bytes: 4 * n * d")
    assert formula_lines(["flops", "peak"], "max(flops / peak, 1) seconds")
    assert formula_lines(["x"], "y = x / sqrt(mean(x**2) + eps)")
    assert not formula_lines(["x", "n"], "x: [n, d] float32; -> [n, d]. n = 0 returns an empty tensor.")
    assert not formula_lines(["rate"], "rate: requests/s, > 0; raises ValueError otherwise")


@pytest.mark.parametrize("path", SOURCES, ids=[p.stem for p in SOURCES])
def test_no_stub_docstring_gives_away_its_formula(path):
    leaks = [f"exercise {ex} {fn}(): {line}" for ex, fn, params, doc in exercise_functions(path)
             for line in formula_lines(params, doc)]
    assert not leaks, "docstrings that state the formula their exercise asks for:\n" + "\n".join(leaks)
