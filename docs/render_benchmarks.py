"""The benchmark pages, rendered from their records: the figures the docs publish are never typed by hand.

Each `python -m minillm.bench NAME --json docs/benchmarks/NAME.json` run leaves a record: its command, date,
machine, torch version, threads and load beside its figures. This file renders them, two ways:

* as an MkDocs hook (mkdocs.yml `hooks:`): at every build the marker `<!-- benchmark records -->` in
  docs/benchmarks/index.md becomes one section per record (the run's conditions, its headline, its tables),
  and `<!-- record NAME.json FIELD -->` on any page becomes that field's tables under the run's conditions;
* as a command: `python docs/render_benchmarks.py` rewrites the README's headline table between
  `<!-- benchmarks:begin -->` and `<!-- benchmarks:end -->`; `--check` only says whether it is current
  (`make test` runs it), so a refreshed record cannot leave a stale figure in the README.

A headline is one sentence a benchmark's record fills in (HEADLINES); a record whose shape no longer fits
its headline fails the build, naming the record and the missing field.
"""
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # minillm from this checkout, whether run as a script or loaded by mkdocs as a hook
    sys.path.insert(0, str(ROOT))
RECORDS = ROOT / "docs" / "benchmarks"
README = ROOT / "README.md"
MARKER = "<!-- benchmark records -->"
EXCERPT = re.compile(r"<!-- record (\S+\.json) (\S+) -->")
BEGIN, END = "<!-- benchmarks:begin -->", "<!-- benchmarks:end -->"
RUN_FIELDS = ("benchmark", "command", "date", "machine", "torch", "conditions")


def _x(value: float) -> str:
    return f"{value:.2f}x"


def _pct(value: float) -> str:
    return f"{value:.1%}"


# benchmark -> the one sentence its record fills in; the README's table and each section's summary
HEADLINES = {
    "decode": lambda r: (f"single-stream decode at {_pct(r['minillm_vs_bare_loop'])} of the bare loop of its matrix "
                         f"products and {_x(r['minillm_vs_transformers'])} transformers; the KV cache "
                         f"{_x(r['per_context'][-1]['speedup'])} faster than recompute at "
                         f"{r['per_context'][-1]['context']} tokens of context"),
    "memory": lambda r: (f"KV memory wasted: {_pct(r['contiguous, max_model_len']['waste'])} contiguous at max "
                         f"length, {_pct(r['paged, block 16']['waste'])} paged (block 16); "
                         f"{r['paged, block 16']['concurrency'] / r['contiguous, max_model_len']['concurrency']:.1f}x "
                         f"the requests at once"),
    "prefix": lambda r: (f"median TTFT {_x(r['ttft_speedup'])} lower with prefix caching "
                         f"({r['ttft_ms_off']:.1f} → {r['ttft_ms_on']:.1f} ms), {_pct(r['hit_rate'])} hit rate"),
    "chunked": lambda r: (f"p99 inter-token latency {_x(r['p99_itl_ratio'])} lower with chunked prefill, at "
                          f"{_x(r['throughput_ratio'])} the throughput"),
    "spec": lambda r: ("batch 1, greedy: " + "; ".join(
        f"{b['proposer']} {_x(b['speedup'])} on {workload} (k = {b['k']}, alpha {b['alpha']:.2f})"
        for workload, b in r["best_batch1"].items())),
    "throughput": lambda r: ("continuous batching " + ", ".join(
        f"{_x(row['continuous / static'])} static at batch {row['batch']}" for row in r["sweep"])
        + f"; {_x(next(iter(r['continuous_batch_8_vs'].values())))} transformers"),
    "serve": lambda r: (f"continuous batching {_x(r['ratios']['goodput_continuous_over_static'])} the goodput of "
                        f"static and {_x(r['ratios']['goodput_continuous_over_sequential'])} sequential on the same "
                        f"arrivals; offline batch {_x(r['cost']['batch_cheaper_x'])} cheaper per token than online"),
    "quant": lambda r: ("; ".join(f"{row['scheme']}: {row['of fp32']} the bytes of fp32, perplexity "
                                  f"{row['perplexity']}, decode {row['vs full']}"
                                  for row in r["schemes"] if row["scheme"] != "full")
                        + f" (full: perplexity {r['schemes'][0]['perplexity']})"),
    "profile": lambda r: (f"a step of one token {r['profile']['fixed'] * 1e3:.1f} ms, "
                          + ", ".join(f"{n} tokens {t * 1e3:.1f} ms more" for n, t in r["profile"]["token_curve"]
                                      if n in (2, 128, 1024))
                          + f"; a step keeps {r['profile']['persistence']:.2f} of the last one's pace"),
    "cluster": lambda r: ("the simulator against real runs: throughput off by " + ", ".join(
        row["error"] for row in r["validation"] if row["figure"] == "output tok/s")
        + f", the worst latency percentile by {r['validation_worst_error']:.0%}; simulated fleet prefix hits "
        + ", ".join(f"{row['prefix hits']} {row['router']}" for row in r["routing"])),
    "agents": lambda r: (f"a {r['variants']['recompute']['pool_blocks']}-block pool holds "
                         f"{r['sessions_held_small_pool']:.1f} waiting sessions alone, "
                         f"{r['sessions_held_small_pool_plus_tier']:.1f} with the offload tier"),
    "kernels": lambda r: (f"{sum(row['ok'] for row in r['smoke'])} of {len(r['smoke'])} kernels match their "
                          f"PyTorch spec on {r['device']}" + (" (correctness only: speed needs a GPU)"
                                                              if r["device"] == "cpu" else "")),
}


def headline(record: dict, source: str) -> str:
    """The record's headline sentence, or '' for a benchmark without one."""
    make = HEADLINES.get(record["benchmark"])
    if make is None:
        return ""
    try:
        return make(record)
    except (KeyError, IndexError, TypeError) as e:
        raise ValueError(f"{source}: the {record['benchmark']} record has no field {e} that its headline in "
                         f"docs/render_benchmarks.py reads; update HEADLINES or the record") from None


def load_records(folder: Path = RECORDS) -> list[tuple[str, dict]]:
    """[(file name, record)] of every *.json in folder, in the order of the benchmarks' registry."""
    from minillm.bench.registry import BENCHMARKS
    order = {name: i for i, name in enumerate(BENCHMARKS)}
    out = []
    for path in sorted(folder.glob("*.json")):
        record = json.loads(path.read_text())
        missing = [f for f in RUN_FIELDS if f not in record]
        if missing:
            raise ValueError(f"{path.name}: a benchmark record needs {', '.join(missing)} (run the benchmark again "
                             f"with --json; minillm/bench/__init__.py writes them)")
        out.append((path.name, record))
    return sorted(out, key=lambda item: (order.get(item[1]["benchmark"], len(order)), item[0]))


def cell(value) -> str:
    """One table cell: floats to 4 significant digits (whole ones in full), long lists summarised, pipes escaped."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return f"{int(value):,}"  # a count or a byte total measured as a float: every digit
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list):
        text = json.dumps(value, default=str)
        if len(text) > 80:
            return f"{len(value)} values"
        return text.replace("|", "\\|")
    return str(value).replace("|", "\\|").replace("\n", " ")


def table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


LONG_LIST = 24  # rows of a list of records beyond which the page points to the record instead
WIDE = 8  # fields of a family of results beyond which they are shown one field a row (else one result a row)


def is_scalar(value) -> bool:
    return not isinstance(value, dict) and not (isinstance(value, list) and value and isinstance(value[0], dict))


def is_flat(value) -> bool:
    """A dict of scalars: one result's fields (a variant's waste and concurrency, a run's percentiles)."""
    return isinstance(value, dict) and bool(value) and all(map(is_scalar, value.values()))


def titled(label: str, body: str) -> str:
    return f"**{label}**\n\n{body}" if label else body


def family(label: str, members: dict[str, dict]) -> str:
    """Results side by side: their scalar fields as rows (many fields) or as columns (few)."""
    fields = list(dict.fromkeys(k for row in members.values() for k, v in row.items() if is_scalar(v)))
    if len(fields) > WIDE:
        return titled(label, table(["figure", *members], [[f, *[row.get(f, "") for row in members.values()]]
                                                          for f in fields]))
    rows = [[key, *[row.get(f, "") for f in fields]] for key, row in members.items()]
    return titled(label, table(["", *fields], rows))


def tables(figures: dict, title: str = "") -> list[str]:
    """The figures as Markdown tables: the scalars in one (figure | value); sibling results with the same fields,
    or a dict of results, side by side; a list of rows as a table (long ones, and raw traces, are left to the
    record); deeper nesting recurses under a bold title."""
    out = []
    scalars = [[name, value] for name, value in figures.items() if is_scalar(value)]
    if scalars:
        out.append(titled(title, table(["figure", "value"], scalars)))
    flats = [name for name, value in figures.items() if is_flat(value)]
    shapes = {name: tuple(figures[name]) for name in flats}
    done = set()
    for name, value in figures.items():
        label = f"{title} / {name}" if title else name
        if name in done:
            continue
        if name in flats:
            siblings = [n for n in flats if shapes[n] == shapes[name]]
            done.update(siblings)
            out.append(family(title, {n: figures[n] for n in siblings}) if len(siblings) > 1
                       else titled(label, table(["figure", "value"], list(value.items()))))
        elif isinstance(value, list) and value and isinstance(value[0], dict):
            if len(value) > LONG_LIST:
                out.append(f"**{label}**: {len(value)} rows, in the record")
                continue
            # raw traces (a request's token times, per-request records) and nested results stay in the record
            raw = {k for row in value for k, v in row.items() if isinstance(v, dict)
                   or (isinstance(v, list) and (len(v) > WIDE or (v and isinstance(v[0], dict))))}
            columns = [c for c in dict.fromkeys(k for row in value for k in row) if c not in raw]
            note = f" ({', '.join(sorted(raw))}: in the record)" if raw else ""
            if len(columns) > WIDE >= len(value):  # a few wide rows read better one field a row
                key, *fields = columns
                out.append(titled(label + note, table([key, *[cell(row.get(key, "")) for row in value]],
                                                      [[f, *[row.get(f, "") for row in value]] for f in fields])))
            else:
                out.append(titled(label + note, table(columns, [[row.get(c, "") for c in columns] for row in value])))
        elif isinstance(value, dict) and value and all(isinstance(v, dict) for v in value.values()):
            out.append(family(label, value))
            for key, row in value.items():
                nested = {k: v for k, v in row.items() if not is_scalar(v)}
                if nested:
                    out.extend(tables(nested, f"{label} / {key}"))
        elif isinstance(value, dict):
            out.extend(tables(value, label))
    return out


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
    from minillm.bench.registry import BENCHMARKS
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
            model = str(record.get("model", "-")).split(",")[0]
            quick = " --quick" if "--quick" in record["command"].split() else ""
            rows.append(f"| [`{stem}`](docs/benchmarks/index.md#{stem}) | {summary} | {model}{quick}, "
                        f"{record['date'][:10]}, {record['machine'].split(',')[0]} |")
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
