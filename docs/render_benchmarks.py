"""The benchmark pages, rendered from their records: the figures the docs publish are never typed by hand.

Each `python -m minillm.bench NAME --json docs/benchmarks/NAME.json` run leaves a record: its command, date,
machine, torch version, threads and load beside its figures. This file renders them, two ways:

* as an MkDocs hook (mkdocs.yml `hooks:`): at every build the marker `<!-- benchmark records -->` in
  docs/benchmarks/index.md becomes one section per record (the run's conditions, its headline, its tables),
  and `<!-- record NAME.json FIELD -->` on any page becomes that field's tables under the run's conditions;
* as a command: `python docs/render_benchmarks.py` rewrites the README's headline table between
  `<!-- benchmarks:begin -->` and `<!-- benchmarks:end -->`; `--check` only says whether it is current
  (`make test` runs it), so a refreshed record cannot leave a stale figure in the README.

Beside it: docs/benchmark_headlines.py (each benchmark's sentence of figures) and docs/benchmark_tables.py (a
record's figures as tables, whatever their shape).
"""
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for folder in (ROOT, ROOT / "docs"):  # minillm from this checkout and the modules beside this one, whether it
    if str(folder) not in sys.path:  # runs as a script or mkdocs loads it as a hook
        sys.path.insert(0, str(folder))

from benchmark_headlines import headline  # noqa: E402
from benchmark_tables import tables  # noqa: E402

RECORDS = ROOT / "docs" / "benchmarks"
README = ROOT / "README.md"
MARKER = "<!-- benchmark records -->"
EXCERPT = re.compile(r"<!-- record (\S+\.json) (\S+) -->")
BEGIN, END = "<!-- benchmarks:begin -->", "<!-- benchmarks:end -->"
RUN_FIELDS = ("benchmark", "command", "date", "machine", "torch", "conditions")


def load_records(folder: Path = RECORDS) -> list[tuple[str, dict]]:
    """[(file name, record)] of every *.json in folder, in the order of the benchmarks' registry."""
    from minillm.bench.catalog import BENCHMARKS
    order = {name: i for i, name in enumerate(BENCHMARKS)}
    out = []
    for path in sorted(folder.glob("*.json")):
        record = json.loads(path.read_text())
        missing = [f for f in RUN_FIELDS if f not in record]
        if missing:
            raise ValueError(f"{path.name}: a benchmark record needs {', '.join(missing)} (run the benchmark again "
                             f"with --json; minillm/bench/__init__.py writes them)")
        out.append((path.name, record))
    # Each benchmark's own record (NAME.json, the default model) first, then its runs on other models (NAME-model.json).
    return sorted(out, key=lambda item: (order.get(item[1]["benchmark"], len(order)),
                                         item[0] != f"{item[1]['benchmark']}.json", item[0]))


def run_line(record: dict) -> str:
    c = record["conditions"]
    load = c.get("load_avg_1min")
    busy = " (busy: compare ratios, not absolute speeds)" if c.get("busy") else ""
    when = record["date"].replace("T", " ")[:16] + " UTC"
    torch = "" if record["torch"] in record["machine"] else f" (torch {record['torch']})"
    return (f"`{record['command']}`  \n{when} · {record['machine']}{torch} · load average "
            f"{'unknown' if load is None else load} on {c['cpus']} CPUs{busy}")


def section(name: str, record: dict) -> str:
    """One record's section of the benchmarks page: its heading (anchor: the file's stem), the run, the
    headline, the link to the raw record, and its tables."""
    from minillm.bench.catalog import BENCHMARKS
    stem = name.removesuffix(".json")
    bench = BENCHMARKS.get(record["benchmark"])
    parts = [f"## {stem}", *([f"*{bench.description[0].upper()}{bench.description[1:]}.*"] if bench else []),
             run_line(record)]
    summary = headline(record, name)
    if summary:
        parts.append(f"**{summary}.**")
    parts.append(f"The record: [{name}]({name}).")
    parts += tables({k: v for k, v in record.items() if k not in RUN_FIELDS})
    return "\n\n".join(parts)


def render_page(records: list[tuple[str, dict]]) -> str:
    return "\n\n".join(section(name, record) for name, record in records)


def render_readme_table(records: list[tuple[str, dict]]) -> str:
    """The README's headline table: one row per record that has a headline, each linking to its section."""
    rows = []
    for name, record in records:
        summary = headline(record, name)
        if summary:
            stem = name.removesuffix(".json")
            run = [str(record["model"]).split(",")[0]] if "model" in record else []  # memory runs no model
            run += ["--quick"] if "--quick" in record["command"].split() else []
            cpu = record["machine"].split(",")[0].replace("(R)", "").replace("(TM)", "")
            rows.append(f"| [`{stem}`](docs/benchmarks/index.md#{stem}) | {summary} | "
                        f"{' '.join([*run, record['date'][:10]])}, {cpu} |")
    return "\n".join(["| benchmark | headline | run |", "| --- | --- | --- |", *rows])


def readme_with_table(readme: str, rendered: str) -> str:
    if BEGIN not in readme or END not in readme:
        raise ValueError(f"README.md has no {BEGIN} ... {END} block for the benchmarks' headline table")
    head, rest = readme.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{rendered}\n{END}{tail}"


def render_excerpt(name: str, field: str, source: str) -> str:
    """One field of one record, for a page outside benchmarks/ (source: the page, for the error)."""
    path = RECORDS / name
    if not path.is_file():
        raise ValueError(f"{source} quotes docs/benchmarks/{name}, which does not exist")
    record = json.loads(path.read_text())
    if field not in record:
        raise ValueError(f"{source} quotes the field {field!r} of {name}, which has no such field")
    return "\n\n".join([run_line(record), *tables({field: record[field]})])


# -- the MkDocs hook --------------------------------------------------------------------------------------
def on_page_markdown(markdown: str, page, config, files) -> str:
    source = f"docs/{page.file.src_uri}"
    markdown = EXCERPT.sub(lambda m: render_excerpt(m.group(1), m.group(2), source), markdown)
    if page.file.src_uri != "benchmarks/index.md":
        return markdown
    if MARKER not in markdown:
        raise ValueError(f"docs/benchmarks/index.md lost its marker {MARKER}, where the records are rendered")
    return markdown.replace(MARKER, render_page(load_records()))


def main(argv: list[str]) -> int:
    check = argv == ["--check"]
    if argv and not check:
        print("usage: python docs/render_benchmarks.py [--check]", file=sys.stderr)
        return 2
    readme = README.read_text()
    wanted = readme_with_table(readme, render_readme_table(load_records()))
    if wanted == readme:
        return 0
    if check:
        print("README.md's benchmark table is not what docs/benchmarks/*.json say: run "
              "`python docs/render_benchmarks.py`", file=sys.stderr)
        return 1
    README.write_text(wanted)
    print("README.md: benchmark table rewritten from docs/benchmarks/*.json")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
