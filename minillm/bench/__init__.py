"""Benchmarks are commands, not tests: `python -m minillm.bench NAME [--quick] [--json PATH]`.

Each benchmark measures its variants side by side in one run, reports medians of repetitions and
the ratios between variants, and names the machine: absolute numbers move with the hardware and
its load, ratios measured together mostly do not.
"""
import json
from pathlib import Path

from minillm.perf.measure import machine


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


def write_json(path: str | None, name: str, figures: dict) -> None:
    if path:
        Path(path).write_text(json.dumps({"benchmark": name, "machine": machine(), **figures}, indent=2) + "\n")
        print(f"\nwrote {path}")
