"""Benchmarks are commands, not tests: `python -m minillm.bench NAME [--quick] [--json PATH] [--model M]
[--threads N]`; `--list` names them (see registry.py).

Each benchmark measures its variants side by side in one run, reports medians of repetitions and
the ratios between variants, and names the machine and its load: absolute numbers move with the
hardware and its load, ratios measured together mostly do not.
"""
import json
import shlex
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch
from tqdm.auto import tqdm

from minillm.perf.machine import machine

BIG_MODEL_BYTES = 100 * 2**20  # tiny's weights are 23 MB, SmolLM2-135M's 540 MB (float32)


def is_big(model: str | Path) -> bool:
    """Whether a model's weight files pass BIG_MODEL_BYTES (a name or a folder). A quick run on a big
    model takes a smaller workload (fewer requests, prompts and tokens, and says so), so that it
    stays a smoke run of a minute or two on 2 CPU cores: every decode step streams all its weights."""
    from minillm.models.registry import resolve_model_path
    folder = resolve_model_path(model)
    return sum(f.stat().st_size for pattern in ("*.safetensors", "*.bin") for f in folder.glob(pattern)
               if f.name != "spec_heads.safetensors") > BIG_MODEL_BYTES


SMALLER_QUICK = "a smaller quick workload for a big model"  # the printed reason, the same in every benchmark


def progress(benchmark: str, total: int, unit: str = "run") -> tqdm:
    """A bar on stderr over a benchmark's variants and repetitions, erased when done so the printed
    tables stay clean; name the variant running with bar.set_description(f"{benchmark}: {variant}").
    TQDM_DISABLE=1 turns it off."""
    return tqdm(total=total, desc=benchmark, unit=unit, leave=False, file=sys.stderr, dynamic_ncols=True)


def print_table(rows: list[dict], title: str) -> None:
    cols = list(rows[0])
    cells = [[_fmt(r[c]) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    print(f"\n{title}")
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths)))
    print("  ".join("-" * w for w in widths))
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)))


def _fmt(v) -> str:
    return f"{v:,.2f}" if isinstance(v, float) else str(v)


def command_line(argv: list[str] | None = None) -> str:
    """The command that ran this process, as a reader would type it again: `python -m minillm.bench ...` when
    it is the benchmarks' command line, however it was started (`python -m minillm.bench`, whose argv[0] is
    this package's __main__.py; `python -m minillm bench` or the `minillm bench` script), else argv as given."""
    argv = sys.argv if argv is None else argv
    package = Path(__file__).resolve().parent
    start = Path(argv[0]).resolve() if argv else None
    if start == package / "__main__.py":
        return shlex.join(["python", "-m", "minillm.bench", *argv[1:]])
    if argv[1:2] == ["bench"] and (start == package.parent / "__main__.py" or Path(argv[0]).name == "minillm"):
        return shlex.join(["python", "-m", "minillm.bench", *argv[2:]])
    return shlex.join(argv)


def run_record(name: str, conditions: dict) -> dict:
    """What a record says about its run beside the figures: the command, when (UTC), the machine, the
    torch version, and the threads and load it started under (conditions: check_conditions()'s record).
    docs/render_benchmarks.py prints these above each benchmark's table."""
    return {"benchmark": name, "command": command_line(),
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": machine(), "torch": torch.__version__, "conditions": conditions}


def write_json(path: str | None, name: str, figures: dict, conditions: dict) -> None:
    """conditions: check_conditions()'s record of the threads and load the run started under."""
    if path:
        record = {**run_record(name, conditions), **figures}
        Path(path).write_text(json.dumps(record, indent=2) + "\n")
        print(f"\nwrote {path}")
