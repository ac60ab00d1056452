"""Where kforge-dash's time to the first chart goes, in the browser: when each milestone of the compare
page first shows (medians of interleaved navigations in fresh Chromium contexts, from navigation start).

    python benchmarks/bench_dash_phases.py RUNS_ROOT [TREE ...] [--repeat 4]

Each TREE (a kforge source tree, e.g. `git archive` of another commit; default: this one) serves the
same RUNS_ROOT. Milestones: app (Streamlit's shell), title, legend, preview (the first chart's static
SVG), plotly (the first plotly element, i.e. plotly.js evaluated), first_path (the first chart's plotly
lines), note (the page's last note: the script is done).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
MARKS = """(() => { const t = {}; window.__t = t; const q = s => document.querySelector(s);
  const mark = (k, ok) => { if (!(k in t) && ok()) t[k] = performance.now(); };
  const tick = () => { try {
    mark('app', () => q('[data-testid=stApp]'));
    mark('title', () => q('h1'));
    mark('legend', () => q('.st-key-legend button'));
    mark('preview', () => [...document.querySelectorAll('[class*=st-key-preview-] img')].some(
        i => i.complete && i.naturalWidth > 0));
    mark('plotly', () => q('.js-plotly-plot'));
    mark('first_path', () => q('.js-plotly-plot .scatterlayer .trace path.js-line'));
    mark('note', () => document.body && document.body.innerText.includes('Drawing '));
  } catch (e) {} if (!('note' in t && 'first_path' in t)) requestAnimationFrame(tick); };
  requestAnimationFrame(tick); })()"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("root", type=Path)
    ap.add_argument("trees", nargs="*", type=Path)
    ap.add_argument("--repeat", type=int, default=4)
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    trees = args.trees or [Path(__file__).resolve().parent.parent]
    servers = []
    for tree in trees:
        port = free_port()
        servers.append((tree, port, subprocess.Popen(
            [sys.executable, "-m", "kforge_dash.cli.dash", str(args.root), "--port", str(port)], cwd=tree,
            env={**os.environ, "PYTHONPATH": str(tree)}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)))
    try:
        for _, port, _ in servers:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                try:
                    if urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2).read() == b"ok":
                        break
                except OSError:
                    time.sleep(0.5)
        rows: dict = {tree: [] for tree, _, _ in servers}
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            for i in range(args.repeat + 1):  # the first round fills the servers' caches: left out
                for tree, port, _ in servers:
                    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
                    ctx.add_init_script(MARKS)
                    page = ctx.new_page()
                    page.set_default_timeout(300_000)
                    page.goto(f"http://127.0.0.1:{port}/compare")
                    page.wait_for_function("() => window.__t && 'note' in window.__t && 'first_path' in window.__t")
                    if i:
                        rows[tree].append(page.evaluate("() => window.__t"))
                    ctx.close()
            browser.close()
    finally:
        for _, _, proc in servers:
            proc.terminate()
    keys = ("app", "title", "legend", "preview", "plotly", "first_path", "note")
    print(f"\n{args.root}: median s from navigation start, {args.repeat} interleaved navigations, "
          f"1-min load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores\n")
    print("| tree | " + " | ".join(keys) + " |")
    print("| --- |" + " ---: |" * len(keys))
    for tree, marks in rows.items():
        cells = [statistics.median(m[k] for m in marks) / 1000 if all(k in m for m in marks) else None for k in keys]
        print(f"| {tree} | " + " | ".join("—" if c is None else f"{c:.2f}" for c in cells) + " |")


if __name__ == "__main__":
    main()
