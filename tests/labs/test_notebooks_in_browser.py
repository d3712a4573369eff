"""The solution notebooks as a learner sees them: JupyterLab in a real Chromium.

Each executed solution notebook (kept by test_lab_notebooks_run.py earlier in the session, or run here when that
test did not run) is opened in JupyterLab, served on a loopback port from fresh settings and workspace folders, and
checked for what only a browser shows: no error output, every plotly figure drawn, each figure's axes spanning its
data (finite ranges, tick labels that are numbers, every plotted point inside and filling a fair share of the axis),
and its labels on the plot, at their lines (figure_problems.js). A screenshot of every figure is kept in
runs/notebook-figures/<lab>/<n>.png (the path is printed). Skips, saying why, where no Chromium can be had.
"""
import json
import os
import shutil
import sys
from pathlib import Path

import nbformat
import pytest
from executed_notebooks import ExecutedNotebooks, measures_on_the_real_model

from minillm.labkit.notebook import lab_sources
from minillm.testing import CHROMIUM_FLAGS, chromium, free_port, serve

pytestmark = [pytest.mark.browser, pytest.mark.notebook, pytest.mark.subprocess, pytest.mark.slow]

sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
pytest.importorskip("jupyterlab", reason="JupyterLab is not installed (the lab extra: pip install -e '.[lab]')")

ROOT = Path(__file__).resolve().parents[2]
FIGURES = ROOT / "runs" / "notebook-figures"
RUN_TIMEOUT_S = 600  # per cell, for a notebook this session has not run yet (a hang guard)
PLOTLY = "application/vnd.plotly.v1+json"
SETTINGS = {  # JupyterLab user settings: no news or update checks (no network), every cell in the page at once
    "@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": False},
    "@jupyterlab/notebook-extension:tracker": {"windowingMode": "none"},
}
MIN_FILL = 0.3  # the plotted points must span at least this share of each axis they are on
FIGURE_PROBLEMS_JS = (Path(__file__).parent / "figure_problems.js").read_text()
# Output areas that show an error: a traceback (JupyterLab shows errors as stderr), or an output it cannot render.
ERRORS_JS = """() => [...document.querySelectorAll('.jp-OutputArea-output')]
  .filter(e => /Traceback|No renderer could be found/.test(e.innerText))
  .map(e => e.innerText.slice(0, 300))"""
DRAWN_JS = """() => [...document.querySelectorAll('.js-plotly-plot')]
  .filter(g => g._fullLayout && g.querySelector('.main-svg')).length"""


@pytest.fixture(scope="module")
def jupyterlab(tmp_path_factory):
    """JupyterLab serving the executed notebooks on 127.0.0.1, no token, fresh settings, workspaces and runtime
    folders, nothing fetched from the network; stopped at the end (and by `timeout` should the test be killed)."""
    home = tmp_path_factory.mktemp("jupyterlab")
    for plugin, values in SETTINGS.items():
        path = home / "settings" / f"{plugin.replace(':', '/')}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    port, notebooks = free_port(), ExecutedNotebooks(tmp_path_factory).folder
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.open_browser=False",
           "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
           "--IdentityProvider.token=", "--PasswordIdentityProvider.hashed_password=", "--ServerApp.allow_root=True",
           f"--ServerApp.root_dir={notebooks}", f"--LabApp.user_settings_dir={home / 'settings'}",
           f"--LabApp.workspaces_dir={home / 'workspaces'}", "--LabApp.news_url=None",
           "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate", "--LabApp.extension_manager=readonly"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "JUPYTER_CONFIG_DIR": str(home / "config"),
           "JUPYTER_DATA_DIR": str(home / "data"), "JUPYTER_RUNTIME_DIR": str(home / "runtime")}
    with serve(cmd, f"http://127.0.0.1:{port}", "/api/status", home / "server.log", env=env, stop_within=900) as url:
        yield url


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """Debian's Chromium, headless, with a fresh profile."""
    executable = chromium()
    with sync_api.sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            tmp_path_factory.mktemp("chromium-profile"), executable_path=executable, args=CHROMIUM_FLAGS,
            viewport={"width": 1400, "height": 2000})  # tall enough for the tallest figure to fit on screen
        try:
            yield context
        finally:
            context.close()


@pytest.mark.timeout(1800)
# Last lab first: test_lab_notebooks_run.py asks for the same executed notebooks from lab 00 up, so where the two
# tests run on two xdist workers at once each executes notebooks from its own end. In the same order they marched in
# step, one executing a notebook while the other waited for it: 160 s of a worker's waiting in one suite run.
@pytest.mark.parametrize("source", lab_sources(ROOT)[::-1], ids=lambda p: p.stem)
def test_notebook_shows_no_error_and_its_figures_span_their_data(source, browser, jupyterlab, tmp_path_factory,
                                                                 request):
    notebooks = ExecutedNotebooks(tmp_path_factory)
    if measures_on_the_real_model(source) and not notebooks.executed(source.stem):
        request.getfixturevalue("real_model_held")  # this test runs it: not beside another holder of the real model
    path = notebooks.path(source.stem, timeout=RUN_TIMEOUT_S)
    nb = nbformat.read(path, as_version=4)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    errors = [f"{o.ename}: {o.evalue}" for o in outputs if o.output_type == "error"]
    errors += [o.text[-300:] for o in outputs if o.get("name") == "stderr" and "Traceback" in o.text]
    assert not errors, f"{source.stem} has error outputs:\n" + "\n".join(errors)
    expected = sum(PLOTLY in o.get("data", {}) for o in outputs)

    folder = FIGURES / source.stem
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    page = browser.new_page()
    try:
        page.goto(f"{jupyterlab}/lab/tree/{path.name}?reset")
        try:
            page.wait_for_function(f"() => document.querySelectorAll('.jp-Notebook .jp-Cell').length === "
                                   f"{len(nb.cells)} && ({DRAWN_JS})() === {expected}", timeout=90_000)
        except sync_api.TimeoutError:
            pass  # the assertions below say what is missing
        page.wait_for_timeout(500)  # let the last figure finish its layout
        shown = page.evaluate(ERRORS_JS)
        assert not shown, f"{source.stem} shows errors in JupyterLab:\n" + "\n---\n".join(shown)
        drawn = page.evaluate(DRAWN_JS)
        assert drawn == expected, f"{source.stem}: {drawn} of its {expected} plotly outputs are drawn in JupyterLab"
        problems = []
        for n, figure in enumerate(page.locator(".js-plotly-plot").all(), 1):
            figure.scroll_into_view_if_needed()
            page.wait_for_timeout(200)  # JupyterLab may shift the cells once scrolled: capture where it settles
            figure.screenshot(path=folder / f"{n}.png")
            found = figure.evaluate(FIGURE_PROBLEMS_JS, MIN_FILL)
            problems += [f"figure {n} ({found['title']}): {p}" for p in found["problems"]]
    finally:
        page.close()
    print(f"{source.stem}: {expected} figure screenshots in {folder}")
    assert not problems, f"{source.stem} (screenshots in {folder}):\n" + "\n".join(problems)
