"""A real browser: `streamlit run` on a loopback port, headless Chromium driven by Playwright.

It presses Run, waits for tokens to stream, pauses and resumes, visits every page, and saves screenshots under the
test's temporary directory (the path is printed). Skips, saying why, where no Chromium can be had.
"""
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from conftest import APP

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.skip("no Chromium on this machine: install Debian's `chromium` (.ci/run does) to run the browser test")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def server():
    """The app served on 127.0.0.1; stopped at the end (and by `timeout` should the test be killed)."""
    port = free_port()
    cmd = [sys.executable, "-m", "streamlit", "run", str(APP), "--server.headless", "true",
           "--server.address", "127.0.0.1", "--server.port", str(port), "--browser.gatherUsageStats", "false",
           "--client.toolbarMode", "minimal", "--server.fileWatcherType", "none"]
    if shutil.which("timeout"):
        cmd = ["timeout", "300", *cmd]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).read() == b"ok":
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"streamlit did not start:\n{proc.stdout.read() if proc.poll() is not None else ''}")
            time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_a_generation_streams_in_a_real_browser(server, tmp_path):
    executable = chromium()
    sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 2400})
            page.goto(server)
            rate = page.get_by_label("Arrival rate (requests/s, 0 = all at once)")
            rate.fill("3")  # requests keep arriving for ~8 s: the first screenshot catches the run mid-way
            rate.press("Enter")
            page.wait_for_timeout(1000)
            page.get_by_role("button", name="Run", exact=False).first.click(timeout=60_000)
            page.get_by_text("Streams", exact=True).wait_for(timeout=60_000)
            page.get_by_role("button", name="Pause").click()  # hold the run mid-way for a steady picture
            # On a busy machine the run may end before the click lands; then there is nothing to pause.
            page.get_by_text(re.compile("Run (paused|finished)")).wait_for(timeout=60_000)
            page.wait_for_timeout(2000)
            page.screenshot(path=tmp_path / "live_mid_run.png", full_page=True)
            if page.get_by_text("Run paused").count():
                page.get_by_role("button", name="Resume").click()
            page.get_by_text("Run finished").wait_for(timeout=120_000)
            codes = page.locator('[data-testid="stCode"]')
            assert codes.count() > 0 and codes.first.inner_text().strip(), "tokens should be on the page"
            page.wait_for_timeout(1000)
            page.screenshot(path=tmp_path / "live.png", full_page=True)
            for link, name in (("Scheduler timeline", "timeline"), ("Paged memory explorer", "memory"),
                               ("Roofline", "roofline")):
                page.get_by_role("link", name=link).click()
                page.locator('[data-testid="stPlotlyChart"]').first.wait_for(timeout=60_000)
                page.wait_for_timeout(1500)
                assert page.locator('[data-testid="stException"]').count() == 0, f"{name} page raised"
                page.screenshot(path=tmp_path / f"{name}.png", full_page=True)
        finally:
            browser.close()
    print(f"screenshots in {tmp_path}")
