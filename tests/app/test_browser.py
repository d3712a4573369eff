"""A real browser: `streamlit run` on a loopback port, headless Chromium driven by Playwright.

It presses Run, waits for tokens to stream, pauses and resumes, visits every page (on Speculative decoding it
runs the proposals, the k sweep and the comparison), runs the engine with the solutions' parts through "Run with
my lab notebook", and saves screenshots under the test's temporary directory
(the path is printed), or under $MINILLM_SCREENSHOTS (`make screenshots`: the docs' pictures). The Quantization
page has a test of its own: its figures, the side-by-side generation and
the sensitivity heatmap; so has the Kernels page: a kernel's recorded access map, and paged decode's walk through
the pool; so has the Serving page: a small load test against the in-process server; so has the Chat page: two turns,
the second one served in part by the prefix cache. Every request the browser makes,
on every page of every test, must go to the app on 127.0.0.1: the app works offline. Skips, saying why, where no
Chromium can be had.
"""
import os
import re
import sys
from pathlib import Path
from urllib.parse import urlparse

import pytest
from app_pages import APP
from test_my_notebook import ROOT

from minillm.testing import CHROMIUM_FLAGS, chromium, free_port, serve

pytestmark = [pytest.mark.browser, pytest.mark.subprocess, pytest.mark.slow]
# ms a page may take to draw what a step waits for: a guard against a hang, not a speed bound. Alone each page draws in
# seconds; under `make test` the other worker may hold both cores (a real-model fleet's processes), and a CI run saw
# the kernels page's charts take over 60 s there.
WAIT = 180_000


@pytest.fixture
def shots(tmp_path):
    """Where the screenshots go: $MINILLM_SCREENSHOTS when set (`make screenshots` takes the docs' pictures from
    these tests), else the test's temporary directory."""
    folder = os.environ.get("MINILLM_SCREENSHOTS")
    if not folder:
        return tmp_path
    path = Path(folder).resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture
def server(tmp_path):
    """The app served on 127.0.0.1; stopped at the end (and by `timeout` should the test be killed)."""
    port = free_port()
    cmd = [sys.executable, "-m", "streamlit", "run", str(APP), "--server.headless", "true",
           "--server.address", "127.0.0.1", "--server.port", str(port), "--browser.gatherUsageStats", "false",
           "--client.toolbarMode", "minimal", "--server.fileWatcherType", "none"]
    with serve(cmd, f"http://127.0.0.1:{port}", "/_stcore/health", tmp_path / "streamlit.log",
               env={**os.environ, "OMP_NUM_THREADS": "1"}, start_within=60, ready=lambda body: body == b"ok") as url:
        yield url
    # A page that raised shows the browser only its first lines; pytest prints this should the test fail.
    text = (tmp_path / "streamlit.log").read_text(errors="replace")
    if "Traceback" in text:
        print("the app's log:\n" + re.sub(r"\x1b\[[0-9;]*m", "", text)[-6000:])


def off_the_machine(urls: list[str]) -> list[str]:
    """The URLs that leave this machine: any host but the loopback one (inline data: and blob: URLs stay)."""
    return [u for u in urls if urlparse(u).scheme not in ("data", "blob")
            and urlparse(u).hostname not in ("127.0.0.1", "localhost")]


@pytest.fixture
def page(server):
    """A headless Chromium page open on the app; the browser is closed at the end. Every request and
    websocket it opened is recorded, and the test fails if one went anywhere but 127.0.0.1."""
    executable = chromium()
    sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
    seen = []
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 2400})
            page.on("request", lambda request: seen.append(request.url))
            page.on("websocket", lambda websocket: seen.append(websocket.url))
            page.goto(server)
            yield page
        finally:
            browser.close()
    assert seen, "the page's requests were recorded"
    assert not off_the_machine(seen), f"the app reached beyond localhost: {sorted(set(off_the_machine(seen)))}"


def run_button(page):
    """The Run button (its name may carry its icon's name first), and not "Help for Run with my lab notebook"."""
    return page.get_by_role("button", name=re.compile(r"\bRun$"))


def test_a_generation_streams_in_a_real_browser(page, shots):
    from playwright import sync_api
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    rate = page.get_by_label("Arrival rate (requests/s, 0 = all at once)")
    rate.fill("3")  # requests keep arriving for ~8 s: the first screenshot catches the run mid-way
    rate.press("Enter")
    page.wait_for_timeout(1000)
    run_button(page).click(timeout=WAIT)
    page.get_by_text("Streams", exact=True).wait_for(timeout=WAIT)
    try:  # hold the run mid-way for a steady picture
        page.get_by_role("button", name="Pause").click(timeout=5_000)
    except PlaywrightTimeout:
        pass  # on a busy machine the run may end before the click lands; then there is nothing to pause
    page.get_by_text(re.compile("Run (paused|finished)")).wait_for(timeout=WAIT)
    page.wait_for_timeout(2000)
    page.screenshot(path=shots / "live_mid_run.png", full_page=True)
    if page.get_by_text("Run paused").count():
        page.get_by_role("button", name="Resume").click()
    page.get_by_text("Run finished").wait_for(timeout=WAIT)
    # "Run finished" can be drawn a moment before the streams' code blocks are: wait for tokens in the first one
    sync_api.expect(page.locator('[data-testid="stCode"]').first).to_have_text(re.compile(r"\S"), timeout=WAIT)
    page.wait_for_timeout(1000)
    page.screenshot(path=shots / "live.png", full_page=True)
    for link, name in (("Scheduler timeline", "timeline"), ("Paged memory explorer", "memory"),
                       ("Roofline", "roofline"), ("Cluster", "cluster")):
        page.get_by_role("link", name=link).click()
        # A chart of this page, not the last page's stale one (faded until the script reaches its place).
        page.locator('[data-stale="false"] [data-testid="stPlotlyChart"]').first.wait_for(timeout=WAIT)
        page.wait_for_timeout(1500)
        assert page.locator('[data-testid="stException"]').count() == 0, f"{name} page raised"
        page.screenshot(path=shots / f"{name}.png", full_page=True)
    run_speculative(page, shots)
    run_with_my_notebook(page, shots)
    print(f"screenshots in {shots}")


def run_speculative(page, shots) -> None:
    """The Speculative decoding page: a run marks each step's proposals, the k sweep draws its charts, the
    proposers are compared (short outputs, to keep it quick)."""
    page.get_by_role("link", name="Speculative decoding").click()
    box = page.get_by_label("Max tokens per prompt", exact=True)
    box.fill("16")
    box.press("Enter")
    page.wait_for_timeout(500)
    run_button(page).click(timeout=WAIT)
    page.get_by_text("Last run:").wait_for(timeout=WAIT)
    marks = page.locator('span[style*="line-through"]')  # the legend's two, and any rejected or unreached proposal
    # The caption is drawn before the run's tokens: wait for a third mark rather than counting at once.
    marks.nth(2).wait_for(timeout=WAIT)
    assert marks.count() > 2, "the rejected proposals are struck through"
    page.get_by_role("button", name=re.compile("Run the k sweep$")).click()
    page.get_by_text("Sweep:").wait_for(timeout=WAIT)
    page.get_by_role("button", name=re.compile("Compare the proposers$")).click()
    page.locator('[data-testid="stPlotlyChart"]').nth(2).wait_for(timeout=WAIT)
    page.wait_for_timeout(1500)
    assert page.locator('[data-testid="stException"]').count() == 0, "the speculative decoding page raised"
    assert page.locator('[data-testid="stPlotlyChart"]').count() == 3, "the k sweep's two charts and the comparison"
    page.screenshot(path=shots / "speculative.png", full_page=True)


def run_with_my_notebook(page, shots) -> None:
    """The switch on, the solutions as the learner's notebooks (every lab's parts, the default): the engine
    runs their parts, and says so."""
    page.get_by_role("link", name="Live engine").click()
    page.get_by_text("Run with my lab notebook").click()
    folder = page.get_by_label("Notebook folder", exact=True)
    folder.fill(str(ROOT / "solutions"))
    folder.press("Enter")
    for field, value in (("Requests", "4"), ("Arrival rate (requests/s, 0 = all at once)", "0")):
        box = page.get_by_role("spinbutton", name=field, exact=True)
        box.fill(value)
        box.press("Enter")
    page.get_by_text("Run reads").wait_for(timeout=WAIT)
    run_button(page).click()
    page.get_by_text("This run's engine runs your exercises").wait_for(timeout=WAIT)  # the new run's badge
    page.get_by_text("Run finished").wait_for(timeout=WAIT)
    assert page.locator('[data-testid="stException"]').count() == 0, "the run with the learner's parts raised"
    assert page.get_by_text("4.3 continuous_step").count(), "the page names the learner's exercises"
    page.wait_for_timeout(1000)
    page.screenshot(path=shots / "my_notebook.png", full_page=True)
    page.locator('[data-testid="stSidebar"]').screenshot(path=shots / "my_notebook_switch.png")


def test_the_quantization_page_in_a_real_browser(page, shots):
    """Quality, bytes and the memory budget on the first visit; Generate puts both greedy texts side by side with
    the token where they part marked; the heatmap button draws every layer and projection."""
    page.get_by_role("link", name="Quantization").click(timeout=WAIT)
    page.get_by_text("Quality and size: int4-g64").wait_for(timeout=WAIT)  # the held-out text, read once
    page.locator('[data-testid="stPlotlyChart"]').first.wait_for(timeout=WAIT)
    page.get_by_role("button", name=re.compile("Generate$")).click()
    page.get_by_text("Last run:").wait_for(timeout=WAIT)
    page.get_by_text("Full precision (fp32)", exact=True).wait_for(timeout=WAIT)
    page.wait_for_timeout(1000)  # the two texts are drawn just after the caption
    marked = page.locator('span[style*="background:#ffd8a8"]').count()  # the legend's, then one per text
    assert marked == 3 or page.get_by_text("agree on the first 48 of 48").count(), \
        f"where they part is marked ({marked} marks)"
    page.get_by_role("button", name=re.compile(r"Measure the sensitivity \(")).click()
    page.locator('[data-testid="stPlotlyChart"]').nth(1).wait_for(timeout=WAIT)
    page.wait_for_timeout(1500)
    assert page.locator('[data-testid="stException"]').count() == 0, "the quantization page raised"
    assert page.locator('[data-testid="stPlotlyChart"]').count() == 2, "the memory budget and the heatmap"
    page.screenshot(path=shots / "quantization.png", full_page=True)
    print(f"screenshot in {shots}")


def test_the_kernels_page_in_a_real_browser(page, shots):
    """vector add's grid and buffers on the first visit, checked against its spec; paged decode attention draws
    how a program walks the pool, its block table and the K/V pools, without a Python exception."""
    page.get_by_role("link", name="Kernels").click(timeout=WAIT)
    page.get_by_text("Outputs stored exactly once").wait_for(timeout=WAIT)
    page.locator('[data-testid="stPlotlyChart"]').nth(3).wait_for(timeout=WAIT)
    assert page.locator('[data-testid="stPlotlyChart"]').count() == 4, "the grid and vector add's 3 buffers"
    page.get_by_text("These figures need a GPU").wait_for(timeout=WAIT)
    page.wait_for_timeout(1500)
    page.screenshot(path=shots / "kernels_vector_add.png", full_page=True)
    page.get_by_text("paged decode attention", exact=True).click()
    page.get_by_text("walks the pool").first.wait_for(timeout=WAIT)
    page.locator('[data-testid="stSelectbox"]').filter(has_text="Follow one program").click()
    page.get_by_role("option", name="program (1, 1)").click()
    page.get_by_text("How program (1, 1) walks the pool").wait_for(timeout=WAIT)
    page.locator('[data-testid="stPlotlyChart"]').nth(8).wait_for(timeout=WAIT)
    page.wait_for_timeout(1500)
    assert page.locator('[data-testid="stException"]').count() == 0, "the kernels page raised"
    assert page.locator('[data-testid="stPlotlyChart"]').count() == 9, "grid, walk and the kernel's 7 buffers"
    page.screenshot(path=shots / "kernels_paged_decode.png", full_page=True)
    print(f"screenshots in {shots}")


def test_the_serving_page_in_a_real_browser(page, shots):
    """A small load test: the server's /metrics panel counts every request, the table, the latency-throughput
    curve, the distributions and the cost chart are drawn, without a Python exception."""
    page.get_by_role("link", name="Serving").click(timeout=WAIT)
    page.get_by_text("the server starts on the first press").wait_for(timeout=WAIT)
    for field, value in (("Requests", "4"), ("Max tokens", "8")):
        box = page.get_by_role("spinbutton", name=field, exact=True)
        box.fill(value)
        box.press("Enter")
        page.wait_for_timeout(500)
    page.get_by_role("button", name=re.compile(r"Run the load test \(4 requests")).click(timeout=WAIT)
    page.get_by_text("Last run:").wait_for(timeout=WAIT)
    page.locator('[data-testid="stPlotlyChart"]').nth(2).wait_for(timeout=WAIT)
    page.wait_for_timeout(1500)
    assert page.locator('[data-testid="stException"]').count() == 0, "the serving page raised"
    assert page.get_by_text("4 of 4", exact=True).count() == 1, "the server counted the 4 requests"
    assert page.locator('[data-testid="stPlotlyChart"]').count() == 3, "the curve, the distributions and the cost"
    page.screenshot(path=shots / "serving.png", full_page=True)
    print(f"screenshot in {shots}")


def test_the_chat_page_in_a_real_browser(page, shots):
    """Two turns typed into the chat box: each answer streams in, the second turn's prompt is partly served by
    the prefix cache (its first turn's blocks marked hit), and each turn has its pool picture beside it."""
    from test_chat_page import FIRST, SECOND
    page.get_by_role("link", name="Chat").click(timeout=WAIT)
    box = page.get_by_role("spinbutton", name="Max tokens per answer", exact=True)
    box.fill("12")
    box.press("Enter")
    page.wait_for_timeout(500)
    for number, text in ((1, FIRST), (2, SECOND)):
        chat_box = page.get_by_placeholder("Write a message")
        chat_box.fill(text)
        chat_box.press("Enter")
        page.get_by_text(f"Turn {number}: green").wait_for(timeout=WAIT)
    page.locator('[data-testid="stPlotlyChart"]').nth(1).wait_for(timeout=WAIT)
    page.wait_for_timeout(1500)
    assert page.locator('[data-testid="stException"]').count() == 0, "the chat page raised"
    assert page.locator('[data-testid="stChatMessage"]').count() == 4, "two questions, two answers"
    hits = re.search(r"Turn 2: green hit: (\d+) blocks", page.get_by_text("Turn 2: green").inner_text())
    assert hits and int(hits.group(1)) > 0, "turn 2 found turn 1's blocks in the prefix cache"
    page.screenshot(path=shots / "chat.png", full_page=True)
    print(f"screenshot in {shots}")


def test_only_loopback_urls_stay_on_the_machine():
    """The check the page fixture applies, on the request the :material/...: favicon used to make."""
    font = "https://fonts.gstatic.com/s/i/short-term/release/materialsymbolsrounded/memory/default/24px.svg"
    local = ["http://127.0.0.1:8501/_stcore/health", "ws://localhost:8501/_stcore/stream",
             "data:image/svg+xml,<svg></svg>", "blob:http://127.0.0.1:8501/0c1d"]
    assert off_the_machine([*local, font]) == [font]
