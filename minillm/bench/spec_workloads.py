"""The speculative benchmark's workloads (bench/spec.py): held-out code to continue, edits whose
faithful output is in the prompt, and chat questions for an instruct model.

The code and edits are cut from the held-out split of the Python standard library (the bundled
models never trained on it); the chat questions are training/chat_prompts.HELD_OUT, which no
speculator trains on.
"""
import ast
import itertools
import statistics
import textwrap

from minillm.chat_template import ChatTemplate
from minillm.corpus import is_heldout, stdlib_files
from minillm.tokenizer import Tokenizer
from minillm.training.chat_prompts import HELD_OUT

NOT_CODE = ("encodings/", "pydoc_data/")  # held-out files that are tables of data, not code


def heldout_sources() -> list[str]:
    """The held-out stdlib files that are code (the split that trained the bundled models)."""
    return [p.read_text(encoding="utf-8", errors="replace") for rel, p in stdlib_files()
            if is_heldout(rel) and not rel.startswith(NOT_CODE)]


def round_robin(groups: list[list], n: int) -> list:
    """n items taken in turn from each group (its first, then its second, ...)."""
    return [x for x in itertools.chain(*itertools.zip_longest(*groups)) if x is not None][:n]


def code_prompts(tokenizer, sources: list[str], n: int, length: int) -> list[list[int]]:
    """n prompts of `length` tokens, each starting at a def or class line, spread over the files."""
    groups = []
    for text in sources:
        lines = text.splitlines(keepends=True)
        offsets = itertools.accumulate(map(len, lines), initial=0)
        starts = [o for o, line in zip(offsets, lines) if line.lstrip().startswith(("def ", "class "))]
        spread = sorted({starts[i * len(starts) // n] for i in range(n)}) if starts else []  # evenly over the file
        ids = [tokenizer.encode(text[o:o + 12 * length])[:length] for o in spread]
        groups.append([x for x in ids if len(x) == length])
    return round_robin(groups, n)


def edit_prompts(tokenizer, sources: list[str], n: int, body: tuple[int, int]) -> list[tuple[list[int], list[int]]]:
    """n edits -> (prompt, its faithful continuation): a function of body[0] to body[1] tokens with
    a one-line header, a comment asking for it renamed, and the renamed header; the continuation is
    the rest of the function, unchanged."""
    groups = []
    for text in sources:
        lines, found = text.splitlines(), []
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef):
                src = textwrap.dedent("\n".join(lines[node.lineno - 1:node.end_lineno]))
                header, rest = src.split("\n", 1) if "\n" in src else (src, "")
                if header.endswith(":") and body[0] <= len(tokenizer.encode(src)) <= body[1]:
                    new = f"{node.name}_renamed"
                    prompt = (f"{src}\n\n\n# {node.name}, renamed to {new}; the body does not change.\n"
                              f"{header.replace(f'def {node.name}(', f'def {new}(', 1)}")
                    ids = tokenizer.encode(prompt)
                    found.append((ids, tokenizer.encode(prompt + "\n" + rest)[len(ids):]))
        groups.append(found)
    return round_robin(groups, n)


def chat_prompts(path, n: int) -> list[list[int]]:
    """n held-out chat questions in the model's own chat template; [] for a model without one."""
    template = ChatTemplate.for_model(path)
    if template.is_default:
        return []
    tokenizer = Tokenizer(path)
    return [tokenizer.encode(template.render([{"role": "user", "content": q}])) for q in HELD_OUT[:n]]


def copied(outputs: list[list[int]], faithful: list[list[int]]) -> float:
    """The median share of an edit's output that repeats the function faithfully before departing."""
    shares = []
    for out, want in zip(outputs, faithful):
        n = next((i for i, (a, b) in enumerate(zip(out, want)) if a != b), min(len(out), len(want)))
        shares.append(n / min(len(out), len(want)))
    return statistics.median(shares)
