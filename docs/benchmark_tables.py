"""A benchmark record's figures as Markdown tables, whatever their shape: the benchmarks write plain JSON
(scalars, results per variant, lists of rows), and docs/render_benchmarks.py shows every figure of it this way.
"""
import json


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
