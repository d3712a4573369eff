"""The README and the docs stay true to the repository: short, every relative link landing on a file (and on a
heading, where it names one), and every benchmark figure rendered from a committed record.

`make test` also builds the site with `mkdocs build --strict`, which checks the links inside docs/; these tests
cover the README, which MkDocs does not read, and the records the pages are rendered from.
"""
import importlib.util
import json
import re
import shlex
from pathlib import Path

import pytest

from minillm.bench import command_line, run_record
from minillm.bench.catalog import BENCHMARKS

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").rglob("*.md"))
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")  # [text](target) and ![alt](target)


def renderer():
    """docs/render_benchmarks.py, the MkDocs hook, as a module (docs/ is no package)."""
    spec = importlib.util.spec_from_file_location("render_benchmarks", ROOT / "docs" / "render_benchmarks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def anchors(page: Path) -> set[str]:
    """The heading ids of a page as MkDocs builds it (the records rendered in where its marker stands), slugged
    as the toc extension does: lower case, punctuation dropped, spaces to hyphens."""
    text = page.read_text()
    render = renderer()
    if render.MARKER in text:
        text = text.replace(render.MARKER, render.render_page(render.load_records()))
    headings = re.findall(r"^#{1,6} (.+)$", text, re.M)
    return {re.sub(r"[\s]+", "-", re.sub(r"[^\w\s-]", "", h).strip().lower()) for h in headings}


def test_the_design_page_names_every_layer_of_the_import_contract():
    """docs/design.md's table of layers is the `layers` contract of pyproject.toml, in the same order: a layer
    added, removed or moved in the contract must be so on the page too."""
    import tomllib
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    layers = next(c for c in contracts if c["id"] == "layers")["layers"]
    rows = [line for line in (ROOT / "docs" / "design.md").read_text().splitlines() if line.startswith("| `")]
    named = [re.findall(r"`(\w+)`", row.split("|")[1]) for row in rows]
    assert named == [[name.strip() for name in layer.split("|")] for layer in layers]


def test_the_readme_stays_within_200_lines_and_shows_a_picture():
    lines = README.read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; keep it to 200 and move the rest into docs/"
    pictures = [target for target in LINK.findall(README.read_text()) if target.endswith(".png")]
    assert pictures and all((ROOT / p).is_file() for p in pictures), f"the README's pictures: {pictures}"


@pytest.mark.parametrize("page", [README, *PAGES], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_lands_on_a_file_and_heading(page):
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue  # a URL (http:, mailto:), or an anchor on the same page
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve()
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: {file.relative_to(ROOT)} has no heading #{anchor}")
    assert not broken, f"{page.relative_to(ROOT)}: {broken}"


def test_the_readme_benchmark_table_is_the_records():
    assert renderer().main(["--check"]) == 0, "run `python docs/render_benchmarks.py`"


def test_every_benchmark_has_a_record_and_every_record_its_run_and_headline():
    render = renderer()
    records = render.load_records()  # raises, naming the file, on a record without its run's fields
    assert {r["benchmark"] for _, r in records} == set(BENCHMARKS), "one record per benchmark in docs/benchmarks/"
    for name, record in records:
        assert render.headline(record, name), f"{name} has no headline in docs/benchmark_headlines.py"
        assert record["command"].startswith(f"python -m minillm.bench {record['benchmark']}"), name


def test_a_record_names_the_command_as_typed_and_the_run_it_made():
    main = str(ROOT / "minillm" / "bench" / "__main__.py")
    assert command_line([main, "prefix", "--quick", "--json", "a b.json"]) == \
        "python -m minillm.bench prefix --quick --json 'a b.json'"
    for via in ([str(ROOT / "minillm" / "__main__.py"), "bench"], ["/venv/bin/minillm", "bench"]):
        assert command_line([*via, "memory", "--quick"]) == "python -m minillm.bench memory --quick", via
    assert command_line(["/usr/bin/pytest", "-k", "x"]) == "/usr/bin/pytest -k x"
    assert command_line([str(ROOT / "minillm" / "__main__.py"), "serve"]) == \
        shlex.join([str(ROOT / "minillm" / "__main__.py"), "serve"])  # not a benchmark: as given
    conditions = {"torch_threads": 1, "cpus": 2, "load_avg_1min": 0.5, "busy": False}
    record = run_record("prefix", conditions)
    assert record["conditions"] == conditions and record["benchmark"] == "prefix"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", record["date"])
    assert record["torch"] in record["machine"]
    json.dumps(record)  # what write_json stores must serialize


def test_a_record_quoted_on_a_page_is_rendered_there():
    render = renderer()
    text = render.EXCERPT.sub(lambda m: render.render_excerpt(m.group(1), m.group(2), "scaling.md"),
                              (ROOT / "docs" / "scaling.md").read_text())
    record = json.loads((ROOT / "docs" / "benchmarks" / "cluster.json").read_text())
    assert record["command"] in text and "| load | figure |" in text
    with pytest.raises(ValueError, match="no such field"):
        render.render_excerpt("cluster.json", "no_such_field", "a page")


def test_a_record_of_any_shape_becomes_tables_with_every_figure_and_no_raw_trace():
    spec = importlib.util.spec_from_file_location("benchmark_tables", ROOT / "docs" / "benchmark_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    figures = {"requests": 100, "hit_rate": 0.796019, "bytes": 12288.0,
               "paged, block 16": {"waste": 0.0203, "concurrency": 48.39},
               "contiguous": {"waste": 0.8234, "concurrency": 8.0},
               "sweep": [{"rate": 2.0, "goodput": 1.9, "records": [{"start": 0.1}]},
                         {"rate": 4.0, "goodput": 3.1, "records": [{"start": 0.2}]}],
               "steps": [{"i": i} for i in range(module.LONG_LIST + 1)]}
    text = "\n\n".join(module.tables(figures))
    assert "| requests | 100 |" in text and "| hit_rate | 0.796 |" in text and "| bytes | 12,288 |" in text
    assert "| paged, block 16 | 0.0203 | 48.39 |" in text and "| contiguous | 0.8234 | 8 |" in text  # one table
    assert text.count("| waste | concurrency |") == 1
    assert "**sweep (records: in the record)**" in text and "| 2 | 1.9 |" in text and "start" not in text
    assert f"**steps**: {module.LONG_LIST + 1} rows, in the record" in text


def test_a_screenshot_is_cut_below_its_content_scaled_and_reduced_to_a_palette(tmp_path):
    from PIL import Image, ImageDraw
    spec = importlib.util.spec_from_file_location("shrink_screenshots", ROOT / "docs" / "shrink_screenshots.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    capture = Image.new("RGB", (1500, 2400), "white")  # a page whose content ends at row 700
    draw = ImageDraw.Draw(capture)
    for i in range(200):  # more colours than the palette keeps
        draw.rectangle((i * 7, 100, i * 7 + 6, 700), fill=(i, 255 - i, (3 * i) % 256))
    capture.save(tmp_path / "page.png")
    size = module.shrink(tmp_path / "page.png", tmp_path / "small.png")
    small = Image.open(tmp_path / "small.png")
    assert small.width == module.WIDTH and small.height == round((700 + 1 + 16) * module.WIDTH / 1500)
    assert small.mode == "P" and len(small.getcolors()) <= module.COLOURS
    assert size == (tmp_path / "small.png").stat().st_size < (tmp_path / "page.png").stat().st_size
