"""Time from navigation to the first drawn chart (and to all charts) in headless Chromium:
kforge-dash's compare page next to TensorBoard's own server over the event files kforge exported
for the same runs.

    python benchmarks/bench_dash_browser.py [--runs 8] [--steps 1000000] [--repeat 3]

Both servers run on 127.0.0.1 and are ready before timing starts (kforge-dash: health check;
TensorBoard: every run's tags listed, i.e. its reservoir loaded, timed separately). Navigations
alternate (kforge, TensorBoard, kforge, ...) and the medians are reported.

"Drawn" means: kforge-dash, an SVG line path in a plotly chart (all charts: every one of the
7 default charts has one); TensorBoard draws on a canvas, so there it is the arrival of the
scalar data of the first card (all: of every card it shows at load) plus two animation frames.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_dash import write_run  # noqa: E402

from kforge_dash.export.history import load_history  # noqa: E402
from kforge_dash.export.tensorboard import write_tensorboard  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync"]
CHARTS = 7


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_runs(root: Path, runs: int, steps: int) -> None:
    for i in range(runs):
        out = root / f"run{i}" / "ingested"
        out.mkdir(parents=True)
        write_run(out / "steps.parquet", steps, seed=i)
        (out / "summary.json").write_text(json.dumps({
            "schema_version": "1.0", "run_name": f"run{i}", "steps": steps, "first_step": 1, "last_step": steps,
            "world_size": 64, "ranks": [], "attempts": [{"attempt": 0, "start_time": 1.7e9 + i, "first_step": 1,
                                                          "last_step": steps}],
            "restarts": [], "tags": [], "hparams": {"seed": i}, "warnings": [], "exports": {}}))
        write_tensorboard(load_history(root / f"run{i}"), str(out / "tensorboard"), with_ranks=False)


def wait_http(url: str, proc, *, timeout: float, check=lambda body: True) -> float:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        if proc.poll() is not None:
            raise SystemExit(f"server exited: {proc.args}")
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if check(r.read()):
                    return time.perf_counter() - t0
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"{url}: not ready after {timeout:.0f} s")


KFORGE_FIRST = ("() => [...document.querySelectorAll('.js-plotly-plot')].some("
                "e => e.querySelector('.scatterlayer .trace path.js-line'))")
KFORGE_ALL = (f"() => {{ const p = [...document.querySelectorAll('.js-plotly-plot')]; return p.length >= {CHARTS} && "
              "p.every(e => e.querySelector('.scatterlayer .trace path.js-line')); }")


def time_kforge(browser, url: str) -> tuple[float, float]:
    page = browser.new_page(viewport={"width": 1400, "height": 2400})
    page.set_default_timeout(300_000)
    t0 = time.perf_counter()
    page.goto(url + "/compare")
    page.wait_for_function(KFORGE_FIRST, polling=50)
    first = time.perf_counter() - t0
    page.wait_for_function(KFORGE_ALL, polling=50)
    every = time.perf_counter() - t0
    page.close()
    return first, every


def time_tensorboard(browser, url: str) -> tuple[float, float, int]:
    page = browser.new_page(viewport={"width": 1400, "height": 2400})
    page.set_default_timeout(300_000)
    done: list[float] = []
    pending: set = set()
    page.on("request", lambda r: pending.add(r) if "/timeseries/timeSeries" in r.url else None)

    def finished(r):
        if r in pending:
            pending.discard(r)
            done.append(time.perf_counter())

    page.on("requestfinished", finished)
    t0 = time.perf_counter()
    page.goto(url + "/#timeseries")
    while not done:
        page.wait_for_timeout(20)
    page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
    first = time.perf_counter() - t0
    quiet_since = time.perf_counter()
    while time.perf_counter() - quiet_since < 1.5:  # no data request pending for 1.5 s: all cards loaded
        page.wait_for_timeout(50)
        if pending:
            quiet_since = time.perf_counter()
    page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
    every = max(max(done) - t0, first)  # "all" includes the first card's frames too
    cards = page.evaluate("() => document.querySelectorAll('scalar-card').length")
    page.close()
    return first, every, cards


FLOOR_APP = """import plotly.graph_objects as go
import streamlit as st
st.title("floor")
st.plotly_chart(go.Figure(go.Scatter(x=[1, 2, 3], y=[1, 3, 2], mode="lines")))
"""


def time_floor(browser, url: str) -> tuple[float, float]:
    """Streamlit's own floor on this machine: a page with one 3-point plotly chart."""
    page = browser.new_page(viewport={"width": 1400, "height": 2400})
    page.set_default_timeout(300_000)
    t0 = time.perf_counter()
    page.goto(url + "/")
    page.wait_for_function(KFORGE_FIRST, polling=50)
    first = time.perf_counter() - t0
    page.close()
    return first, first


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--steps", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--tb-load-timeout", type=float, default=1800.0)
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="kforge-bench-browser-") as tmp:
        root = Path(tmp) / "runs"
        t = time.perf_counter()
        make_runs(root, args.runs, args.steps)
        print(f"wrote and exported {args.runs} runs x {args.steps:,} steps in {time.perf_counter() - t:.0f} s")
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
        kport, tport = free_port(), free_port()
        kd = subprocess.Popen([sys.executable, "-m", "kforge_dash.cli.dash", str(root), "--port", str(kport)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        floor_app = Path(tmp) / "floor.py"
        floor_app.write_text(FLOOR_APP)
        fport = free_port()
        fl = subprocess.Popen([sys.executable, "-m", "streamlit", "run", str(floor_app), "--server.port", str(fport),
                               "--server.headless", "true", "--browser.gatherUsageStats", "false"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        t_tb = time.perf_counter()
        tb = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", str(root), "--host", "127.0.0.1",
                               "--port", str(tport)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            kurl, turl = f"http://127.0.0.1:{kport}", f"http://127.0.0.1:{tport}"
            wait_http(kurl + "/_stcore/health", kd, timeout=120)
            furl = f"http://127.0.0.1:{fport}"
            wait_http(furl + "/_stcore/health", fl, timeout=120)
            # TensorBoard loads event files in the background: ready when every run lists its tags
            # with the last step written (its reservoir has read the whole file).
            wait_http(turl + "/data/plugin/scalars/tags", tb, timeout=args.tb_load_timeout,
                                check=lambda b: len(json.loads(b)) >= args.runs)
            wait_http(turl + f"/data/plugin/scalars/scalars?run=run{args.runs - 1}/ingested/tensorboard&tag=train/loss",
                      tb, timeout=args.tb_load_timeout,
                      check=lambda b: bool(json.loads(b)) and json.loads(b)[-1][1] >= args.steps)
            tb_load = time.perf_counter() - t_tb
            rows = {"kforge-dash": [], "TensorBoard": [], "floor": []}
            cards = None
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
                for _ in range(args.repeat):
                    rows["kforge-dash"].append(time_kforge(browser, kurl))
                    *tb_times, cards = time_tensorboard(browser, turl)
                    rows["TensorBoard"].append(tuple(tb_times))
                    rows["floor"].append(time_floor(browser, furl))
                browser.close()
        finally:
            for proc in (kd, tb, fl):
                proc.terminate()
                proc.wait(timeout=30)
    med = {k: (statistics.median(a for a, _ in v), statistics.median(b for _, b in v)) for k, v in rows.items()}
    load = os.getloadavg()[0]
    print(f"\n{args.runs} runs x {args.steps:,} steps, headless Chromium, median of {args.repeat} interleaved "
          f"navigations; 1-min load average {load:.1f} on {os.cpu_count()} cores (a shared machine: noisy)\n")
    print("| server | first chart drawn (s) | all charts drawn (s) | charts |")
    print("| --- | ---: | ---: | ---: |")
    print(f"| kforge-dash (compare page, {args.runs} runs selected at landing) | {med['kforge-dash'][0]:.2f} | "
          f"{med['kforge-dash'][1]:.2f} | {CHARTS} |")
    print(f"| TensorBoard {tb_version()} (time series, its own server) | {med['TensorBoard'][0]:.2f} | "
          f"{med['TensorBoard'][1]:.2f} | {cards} shown at load |")
    print(f"| Streamlit alone: one 3-point plotly chart (the floor of any Streamlit app here) | {med['floor'][0]:.2f} | "
          f"{med['floor'][1]:.2f} | 1 |")
    print(f"| TensorBoard / kforge-dash | {med['TensorBoard'][0] / med['kforge-dash'][0]:.1f}x | "
          f"{med['TensorBoard'][1] / med['kforge-dash'][1]:.1f}x | |")
    print(f"\nTensorBoard's own load of the event files before its first page (not in the times above): {tb_load:.0f} s")


def tb_version() -> str:
    import tensorboard

    return tensorboard.__version__


if __name__ == "__main__":
    main()
