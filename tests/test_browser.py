"""The real thing: `kforge-dash` as a subprocess on 127.0.0.1, driven by headless Chromium.

Needs Debian's chromium at /usr/bin/chromium (CI installs it); playwright never downloads one.
The screenshot goes to $KFORGE_SCREENSHOT (docs/screenshot-compare.png for the README) or tmp_path.
"""

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from dash_fixtures import copy_and_ingest_sample_runs, sample_run_names

pytestmark = [pytest.mark.slow]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kforge_dash_cmd() -> list[str]:
    """The installed console script next to this interpreter (the real CLI)."""
    script = Path(sys.executable).parent / "kforge-dash"
    return [str(script)] if script.exists() else [sys.executable, "-m", "kforge_dash.cli.dash"]


@pytest.fixture
def server(tmp_path):
    root = copy_and_ingest_sample_runs(tmp_path / "runs")
    port = free_port()
    log = open(tmp_path / "server.log", "w")
    proc = subprocess.Popen([*kforge_dash_cmd(), str(root), "--port", str(port)], stdout=log,
                            stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                    if r.read() == b"ok":
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                log.flush()
                pytest.fail(f"kforge-dash did not come up:\n{(tmp_path / 'server.log').read_text()}")
            time.sleep(0.3)
        yield url, root
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def test_compare_page_in_chromium(server, tmp_path, chromium):
    from playwright.sync_api import sync_playwright

    url, root = server
    names = sample_run_names()
    pick = [n for n in ("baseline-lr1e-3", "spike-nan", "preempted") if n in names] or names[:2]
    shot = Path(os.environ.get("KFORGE_SCREENSHOT") or tmp_path / "screenshot-compare.png")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1250})
            page.set_default_timeout(60_000)
            page.goto(url + "/")  # the compare page is the app's default page
            page.get_by_text("Pick runs to compare").first.wait_for()
            # The sidebar is the app's own navigation (st.navigation), not a listing of files.
            nav = page.get_by_test_id("stSidebarNav").inner_text()
            assert "Compare runs" in nav and "Runs table" in nav and "Run detail" in nav and "common" not in nav
            runs = page.get_by_role("combobox", name="Runs", exact=True)
            for name in pick:
                runs.click()
                runs.fill(name)
                page.get_by_role("option", name=name, exact=True).click()
            page.keyboard.press("Escape")
            # Charts drawn: every chart has an SVG line per selected run (loss: raw and smoothed).
            page.wait_for_function(
                "n => { const p = document.querySelectorAll('.js-plotly-plot');"
                " return p.length >= 4 && [...p].every(e => e.querySelectorAll("
                "'.scatterlayer .trace path.js-line').length >= n); }", arg=len(pick))
            titles = page.locator(".js-plotly-plot .gtitle").all_text_contents()
            assert {"loss", "grad_norm", "lr", "step_time_s"} <= set(titles)
            loss = page.locator(".js-plotly-plot").filter(has=page.locator(".gtitle", has_text="loss")).first
            assert set(pick) <= set(loss.locator(".legendtext").all_text_contents())
            assert loss.locator(".scatterlayer .trace path.js-line").count() >= 2 * len(pick)
            assert set(pick) <= set(page.url.split("?", 1)[1].replace("runs=", "").split("&"))
            time.sleep(1.0)  # let plotly finish its transitions before the picture
            shot.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(shot))
        finally:
            browser.close()
    assert shot.stat().st_size > 10_000
