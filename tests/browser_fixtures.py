"""For the browser tests (their Chromium is conftest's `browser` fixture): a `kforge-dash` server on
127.0.0.1, pages whose requests leave only for the allowed host, the condition that every chart has drawn
its lines, and the compare page settled (its charts still)."""

import contextlib
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from ports_fixtures import free_port, stop

# Every wait is on a condition, with room for a loaded machine (a 2-core runner at load 5-46 took over
# 60 s for one page): a wait ends as soon as its condition holds, so a generous limit costs nothing.
WAIT_MS = 90_000  # a page on a loaded 2-core machine; a missing element fails within this
DRAWN = "n => { const p = document.querySelectorAll('.js-plotly-plot'); return p.length >= n && [...p].every(" \
        "e => e.querySelectorAll('.scatterlayer .trace path.js-line').length >= 1); }"
# The report's charts drawn (DRAWN's test, on the grid's charts only: a run section's MFU waterfall has no line).
CHARTS_DRAWN = DRAWN.replace("'.js-plotly-plot'", "'.charts .js-plotly-plot'")
assert CHARTS_DRAWN != DRAWN


def kforge_dash_cmd() -> list[str]:
    """The installed console script next to this interpreter (the real CLI)."""
    script = Path(sys.executable).parent / "kforge-dash"
    return [str(script)] if script.exists() else [sys.executable, "-m", "kforge_dash.cli.dash"]


@contextlib.contextmanager
def serve(root: Path, log_path: Path):
    port = free_port()
    log = open(log_path, "w")
    proc = subprocess.Popen([*kforge_dash_cmd(), str(root), "--port", str(port)], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + WAIT_MS / 1000
        while True:
            try:
                with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                    if r.read() == b"ok":
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                log.flush()
                pytest.fail(f"kforge-dash did not come up:\n{log_path.read_text()}")
            time.sleep(0.3)
        yield url
    finally:
        stop(proc, timeout=15)
        log.close()


def new_page(browser, *, allow: str = "127.0.0.1", height: int = 1250, width: int = 1400):
    """A page whose requests to anything but `allow` (a host, or 'file') are aborted and recorded."""
    ctx = browser.new_context(viewport={"width": width, "height": height})
    left: list[str] = []

    def gate(route):
        u = urllib.parse.urlsplit(route.request.url)
        if (allow == "file" and u.scheme in ("file", "data", "blob")) or u.hostname == allow or u.scheme in ("data", "blob"):
            route.continue_()
        else:
            left.append(route.request.url)
            route.abort()

    ctx.route("**/*", gate)
    page = ctx.new_page()
    page.set_default_timeout(WAIT_MS)
    return page, left


# True once the charts (how many, their points, their place and size) have not changed for `ms`.
STILL = """ms => { const sig = [...document.querySelectorAll('.js-plotly-plot')].map(e => {
        const r = e.getBoundingClientRect();
        return [r.top, r.height, ...(e._fullData || []).map(d => (d.x || []).length)].join(','); }).join('|');
    const now = performance.now(), w = window.__kforgeStill;
    if (!w || w.sig !== sig) { window.__kforgeStill = {sig, since: now}; return false; }
    return now - w.since >= ms; }"""


def still(page, ms: int = 500) -> None:
    """Wait until the page's charts have not changed for `ms` (plotly's transitions have ended)."""
    page.evaluate("() => { window.__kforgeStill = null; }")
    page.wait_for_function(STILL, arg=ms, polling=100)


def settled(page, still_ms: int = 500) -> None:
    """The compare page's script has finished: its note on what is drawn is written after every chart
    (charts stream in one by one, and the page may redraw them once the notes above them appear);
    then the charts stay as they are for `still_ms`."""
    page.get_by_text("Drawing ", exact=False).first.wait_for()
    still(page, still_ms)
