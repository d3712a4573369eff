""""Run with my lab notebook": the run pages' engine built with the learner's own parts.

The solutions stand in for a finished notebook, freshly generated stubs for an untouched one.
"""
import re
from pathlib import Path

import pytest
from app_pages import errors, run_to_end

from minillm.labkit.notebook import learner_copy, read_source, to_json
from minillm.labkit.plug import LABS, PARTS, calls
from minillm_visualizer.shared.learner_parts import KERNELS_LAB, LAB_PARTS, QUANT_LAB, SERVING_LAB, SPEC_LAB

ROOT = Path(__file__).resolve().parents[2]
# The labs whose parts the run pages use (lab 05's run on the Speculative decoding page, lab 06's on the Quantization
# page); lab 07's kernel is left out of the full runs here: the Triton interpreter would take minutes.
RUN_LABS = sorted(lab for lab in LAB_PARTS if lab != KERNELS_LAB)
RUN_PARTS = {field: part for field, part in PARTS.items() if part[0].split(".")[0].zfill(2) in RUN_LABS}


def switch_on(at, folder, labs=RUN_LABS):
    at.session_state["k_mine"] = True
    at.session_state["k_mine_folder"] = str(folder)
    at.session_state["k_mine_labs"] = list(labs)
    at.run()
    assert not at.exception, [e.value for e in at.exception]


def page_text(at) -> str:
    return "\n".join(e.value for kind in ("markdown", "caption", "error", "warning") for e in at.get(kind))


@pytest.fixture
def stubs(tmp_path):
    """Untouched learner copies of the labs that build engine parts, as `make labs` writes them."""
    for lab in LABS:
        source = next((ROOT / "solutions").glob(f"lab{lab}_*.py"))
        (tmp_path / f"{source.stem}.ipynb").write_text(to_json(learner_copy(read_source(source), source.stem)))
    return tmp_path


def test_the_switch_offers_every_lab_that_builds_an_engine_part():
    assert sorted([*LAB_PARTS, SPEC_LAB, QUANT_LAB, SERVING_LAB]) == LABS


def test_the_solutions_parts_run_the_engine_and_the_page_names_them(app):
    switch_on(app, ROOT / "solutions")
    run = run_to_end(app)
    parts = run.engine.config.components
    assert set(parts.replaced()) == set(RUN_PARTS)
    called = calls(parts)
    assert all(n > 0 for field, n in called.items() if field != "static_step"), f"the parts in use are called: {called}"
    text = page_text(app)
    assert "Your parts" in text and all(f"solutions/lab{lab}_" in text for lab in RUN_LABS)
    assert all(f"{exercise} `{name}`" in text for exercise, name in RUN_PARTS.values())
    for page in ("timeline", "memory"):  # every run page says whose parts ran
        app.switch_page(f"minillm_visualizer/{page}/{page}.py").run()
        assert not app.exception and "Your parts" in page_text(app), page


def test_stub_parts_fail_with_the_exercise_named_and_the_reference_runs_again(app, stubs):
    switch_on(app, stubs)
    app.button(key="b_run").click().run()
    run = app.session_state["run"]
    assert run.wait(30)
    app.run()
    assert not app.exception, [e.value for e in app.exception]
    assert run.status == "failed" and run.final_kv.used_blocks == 0
    failed = [e for e in errors(app) if e.startswith("Your part failed")]
    assert failed and re.search(r"Exercise \d\.\d \(\w+, \S+/lab0\d_\w+\.ipynb\) is not implemented yet", failed[0]), \
        errors(app)
    app.session_state["k_mine"] = False
    app.run()
    again = run_to_end(app)
    assert again.status == "finished" and not again.engine.config.components.replaced()
    assert not any(e.startswith("Your part failed") for e in errors(app))


def test_a_syntax_error_in_an_exercise_cell_names_the_exercise(app, tmp_path):
    nb = read_source(ROOT / "solutions" / "lab03_paged.py")
    cell = next(c for c in nb.cells if c.metadata.get("exercise") == "3.6")
    cell.source = cell.source.replace("def add(self", "def add(self,,", 1)
    (tmp_path / "lab03_paged.ipynb").write_text(to_json(nb))
    switch_on(app, tmp_path, labs=["03"])
    app.button(key="b_run").click().run()
    assert not app.exception
    message = errors(app)[0]
    assert message.startswith("Cannot run with your lab notebook: Exercise 3.6") and "syntax error" in message


@pytest.mark.parametrize("folder, labs, message", [
    ("empty", RUN_LABS, "holds no lab notebook"),
    ("missing", RUN_LABS, "There is no folder"),
    ("solutions", [], "no lab is chosen"),
])
def test_a_folder_or_choice_without_parts_gets_a_message(app, tmp_path, folder, labs, message):
    path = {"empty": tmp_path, "missing": tmp_path / "nowhere", "solutions": ROOT / "solutions"}[folder]
    switch_on(app, path, labs)
    app.button(key="b_run").click().run()
    assert not app.exception
    assert any(message in e for e in errors(app)), errors(app)
    assert "run" not in app.session_state or app.session_state["run"] is None


def test_the_learners_paged_decode_kernel_runs_on_the_triton_backend():
    from minillm.config import Components
    from minillm_visualizer.shared.settings import DEFAULTS, engine_config
    values = {**DEFAULTS, "model": "pico"}
    config = engine_config(values, Components(paged_decode=lambda *args, **kwargs: None))
    assert config.kernels.attention_backend == "triton"
    assert engine_config(values).kernels.attention_backend == DEFAULTS["attention_backend"]

