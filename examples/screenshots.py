"""Regenerate the pictures in docs/ from the bundled sample_runs/, at 1400x1000.

    python examples/screenshots.py                 # docs/screenshot-{compare,detail,report}.png
    python examples/screenshots.py --out /tmp/shots

sample_runs/ is copied to --root (default /tmp/kforge/sample_runs, so the sidebar's "Runs root"
reads well on one line; its old contents are replaced), ingested with
`kforge-ingest --no-tensorboard --no-wandb`, served by `kforge-dash` on a free 127.0.0.1 port and
photographed by headless Chromium (/usr/bin/chromium, never downloaded; every request off
127.0.0.1 or the report file is blocked). The report is written by `kforge-report`. Each picture
waits on the page's own conditions (charts drawn, the detail page's headings there), never on a
fixed sleep alone.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SIZE = {"width": 1400, "height": 1000}
DETAIL_RUN = "throttled"  # two findings (a throttled GPU, the straggler it made), the what-if sentence, both waterfalls
# Every plotly chart (in `sel`) has drawn a line, and there are at least n of them.
DRAWN = """([sel, n]) => { const p = document.querySelectorAll(sel); return p.length >= n && [...p].every(
    e => e.querySelectorAll('.scatterlayer .trace path.js-line').length >= 1); }"""
SETTLE_MS = 800  # plotly's transitions end before the picture (after the conditions above hold)


def _script(name: str) -> list[str]:
    """The installed console script next to this interpreter, or its module."""
    exe = Path(sys.executable).parent / name
    return [str(exe)] if exe.exists() else [sys.executable, "-m", f"kforge_dash.cli.{name.split('-')[1]}"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _serve(root: Path, log: Path):
    port = _free_port()
    with open(log, "w") as out:
        proc = subprocess.Popen([*_script("kforge-dash"), str(root), "--port", str(port)], stdout=out,
                                stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 90
            while True:
                try:
                    with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                        if r.read() == b"ok":
                            break
                except OSError:
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"kforge-dash did not come up; its log: {log}")
                time.sleep(0.3)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _page(browser, allow: str):
    """A 1400x1000 page whose requests to anything but `allow` (a host, or 'file') are aborted."""
    ctx = browser.new_context(viewport=SIZE)

    def gate(route):
        u = urllib.parse.urlsplit(route.request.url)
        ok = u.scheme in ("data", "blob") or (allow == "file" and u.scheme == "file") or u.hostname == allow
        route.continue_() if ok else route.abort()

    ctx.route("**/*", gate)
    page = ctx.new_page()
    page.set_default_timeout(90_000)
    return page


def prepare(root: Path) -> None:
    """A fresh copy of sample_runs/ at `root`, every run ingested (no TensorBoard/W&B exports)."""
    if root.exists():
        shutil.rmtree(root)
    shutil.copytree(REPO / "sample_runs", root, ignore=shutil.ignore_patterns("ingested"))
    subprocess.run([*_script("kforge-ingest"), str(root), "--no-tensorboard", "--no-wandb"], check=True)


def shoot_compare(browser, url: str, out: Path) -> None:
    page = _page(browser, "127.0.0.1")
    page.goto(url + "/")
    page.wait_for_function(DRAWN, arg=[".js-plotly-plot", 4])
    page.get_by_text("Drawing ", exact=False).first.wait_for()  # written once every chart is
    page.wait_for_timeout(SETTLE_MS)
    page.screenshot(path=str(out))
    page.context.close()


def shoot_detail(browser, url: str, out: Path) -> None:
    page = _page(browser, "127.0.0.1")
    page.goto(f"{url}/detail?run={DETAIL_RUN}")
    page.get_by_role("heading", name="Findings").wait_for()
    page.wait_for_function("() => document.querySelectorAll('.js-plotly-plot .main-svg').length >= 2")
    # From the findings down: their table, the what-if sentence and both waterfalls.
    page.get_by_role("heading", name="Findings").evaluate("e => e.scrollIntoView({block: 'start'})")  # Streamlit's own scroller
    page.wait_for_timeout(SETTLE_MS)
    page.screenshot(path=str(out))
    page.context.close()


def shoot_report(browser, root: Path, out: Path) -> None:
    html = root.parent / "report.html"
    subprocess.run([*_script("kforge-report"), str(root), "-o", str(html)], check=True)
    page = _page(browser, "file")
    page.goto(html.as_uri())
    page.wait_for_function(DRAWN, arg=[".charts .js-plotly-plot", 4])
    page.wait_for_timeout(SETTLE_MS)
    page.screenshot(path=str(out))
    page.context.close()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=Path("/tmp/kforge/sample_runs"),
                    help="where sample_runs/ is copied and ingested (replaced)")
    ap.add_argument("--out", type=Path, default=REPO / "docs", help="folder of the PNGs")
    args = ap.parse_args(argv)
    from playwright.sync_api import sync_playwright

    prepare(args.root)
    args.out.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            with _serve(args.root, args.root.parent / "kforge-dash.log") as url:
                shoot_compare(browser, url, args.out / "screenshot-compare.png")
                shoot_detail(browser, url, args.out / "screenshot-detail.png")
            shoot_report(browser, args.root, args.out / "screenshot-report.png")
        finally:
            browser.close()
    for name in ("compare", "detail", "report"):
        print(args.out / f"screenshot-{name}.png")


if __name__ == "__main__":
    main()
