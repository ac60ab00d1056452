"""Time from navigation to the first drawn chart (and to all charts) in headless Chromium:
kforge-dash's compare page next to TensorBoard's own server over the event files kforge exported
for the same runs.

    python benchmarks/bench_dash_browser.py [--runs 8] [--steps 1000000] [--repeat 3]

    python benchmarks/bench_dash_browser.py --root /tmp/runs --baseline /tmp/kforge-prev   # A/B, reusing the runs

    python benchmarks/bench_dash_browser.py --sample [--root /tmp/sample]   # the bundled sample_runs/, ingested
                                                                            # (and exported) by kforge-ingest

Every server runs on 127.0.0.1 and is ready before timing starts (kforge-dash: health check;
TensorBoard: every run's tags listed, i.e. its reservoir loaded, timed separately). Navigations
alternate (kforge, [baseline,] TensorBoard, floor, kforge, ...) and the medians are reported, with
the Chromium CPU seconds of each navigation (the browser's work, steadier than wall time when the
machine is shared).

"On screen" means: kforge-dash, the first chart's static SVG preview (drawn while plotly.js loads, on
a session's first page) or its plotly lines; "interactive" and "drawn": an SVG line path in a plotly
chart (all charts: every chart on the page has one, after its last note). TensorBoard draws on a
canvas, so there all three are the arrival of the scalar data of the first card (all: of every card it
shows at load) plus two animation frames.
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
import urllib.parse
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


def ingest_sample(root: Path) -> None:
    """The repo's sample_runs/ copied to `root` and ingested by the real CLI, which writes the
    TensorBoard event files TensorBoard reads (into each run's folder)."""
    import shutil

    here = Path(__file__).resolve().parent.parent
    shutil.copytree(here / "sample_runs", root, ignore=shutil.ignore_patterns("ingested", "events.out.tfevents.*"))
    subprocess.run([sys.executable, "-m", "kforge_dash.cli.ingest", str(root), "--no-wandb"], check=True,
                   stdout=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(here)})


def tensorboard_runs(root: Path) -> dict[str, int]:
    """{TensorBoard's run name: last step} of every ingested run under `root` (its event files lie in
    RUN/ or RUN/ingested/tensorboard/), for the readiness check."""
    out = {}
    for summary in sorted(root.glob("*/ingested/summary.json")):
        run = summary.parent.parent
        last = json.loads(summary.read_text()).get("last_step") or 0
        tb = run / "ingested" / "tensorboard"
        out[f"{run.name}/ingested/tensorboard" if tb.is_dir() else run.name] = last
    return out


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


# On screen: the first chart's static preview (browse/preview.py, drawn while plotly.js loads) or its
# plotly lines, whichever comes first; interactive: its plotly lines.
KFORGE_SHOWN = ("() => [...document.querySelectorAll('[class*=st-key-preview-] img')].some(i => i.complete && "
                "i.naturalWidth > 0) || [...document.querySelectorAll('.js-plotly-plot')].some("
                "e => e.querySelector('.scatterlayer .trace path.js-line'))")
KFORGE_FIRST = ("() => [...document.querySelectorAll('.js-plotly-plot')].some("
                "e => e.querySelector('.scatterlayer .trace path.js-line'))")
# All: the page's script is done (its "Drawing N of M points" note comes after every chart) and
# every chart cell holds a plotly chart with a line (a chart sent is drawn a few frames later).
KFORGE_ALL = ("() => { const c = [...document.querySelectorAll('[class*=st-key-cell-]')]; return c.length >= 1 && "
              "document.body.innerText.includes('Drawing ') && "
              "c.every(e => e.querySelector('.js-plotly-plot .scatterlayer .trace path.js-line')); }")


def time_kforge(browser, url: str) -> tuple[float, float, float]:
    page = browser.new_page(viewport={"width": 1400, "height": 2400})
    page.set_default_timeout(300_000)
    c0, t0 = chromium_cpu_s(), time.perf_counter()
    page.goto(url + "/compare")
    page.wait_for_function(KFORGE_SHOWN, polling=20)
    shown = time.perf_counter() - t0
    page.wait_for_function(KFORGE_FIRST, polling=20)
    first = time.perf_counter() - t0
    page.wait_for_function(KFORGE_ALL, polling=50)
    every = time.perf_counter() - t0
    cpu = chromium_cpu_s() - c0  # before the page closes: a closed renderer's CPU time is gone from /proc
    charts = page.evaluate("() => document.querySelectorAll('.js-plotly-plot').length")
    page.close()
    return shown, first, every, cpu, charts


def time_tensorboard(browser, url: str) -> tuple[float, float, float, int]:
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
    c0, t0 = chromium_cpu_s(), time.perf_counter()
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
    cpu = chromium_cpu_s() - c0
    page.close()
    return first, first, every, cpu, cards


FLOOR_APP = """import plotly.graph_objects as go
import streamlit as st
st.title("floor")
st.plotly_chart(go.Figure(go.Scatter(x=[1, 2, 3], y=[1, 3, 2], mode="lines")))
"""


def time_floor(browser, url: str) -> tuple[float, float, float]:
    """Streamlit's own floor on this machine: a page with one 3-point plotly chart."""
    page = browser.new_page(viewport={"width": 1400, "height": 2400})
    page.set_default_timeout(300_000)
    c0, t0 = chromium_cpu_s(), time.perf_counter()
    page.goto(url + "/")
    page.wait_for_function(KFORGE_FIRST, polling=20)
    first = time.perf_counter() - t0
    cpu = chromium_cpu_s() - c0
    page.close()
    return first, first, first, cpu


def chromium_cpu_s() -> float:
    """CPU seconds used so far by this user's Chromium processes (browser, renderers, GPU/SwiftShader):
    the browser's work, much less sensitive than wall time to a shared machine's load (Linux /proc)."""
    tick, total = os.sysconf("SC_CLK_TCK"), 0
    for d in Path("/proc").glob("[0-9]*"):
        try:
            if d.stat().st_uid == os.getuid() and (d / "cmdline").read_bytes().startswith(b"/usr/lib/chromium/"):
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
                total += int(fields[11]) + int(fields[12])
        except OSError:
            continue
    return total / tick


def start_servers(root: Path, tmp: Path, baseline: Path | None) -> dict:
    """kforge-dash (this tree, and `baseline`'s when given), the floor app and TensorBoard, all started."""
    here = Path(__file__).resolve().parent.parent
    procs = {}
    for label, tree in (("kforge-dash", here), ("kforge-dash (baseline)", baseline)):
        if tree is None:
            continue
        port = free_port()
        env = {**os.environ, "PYTHONPATH": str(tree)}
        procs[label] = (subprocess.Popen([sys.executable, "-m", "kforge_dash.cli.dash", str(root), "--port", str(port)],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=tree), port)
    floor_app = tmp / "floor.py"
    floor_app.write_text(FLOOR_APP)
    port = free_port()
    procs["floor"] = (subprocess.Popen([sys.executable, "-m", "streamlit", "run", str(floor_app), "--server.port", str(port),
                                        "--server.headless", "true", "--browser.gatherUsageStats", "false"],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), port)
    port = free_port()
    procs["TensorBoard"] = (subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", str(root), "--host",
                                              "127.0.0.1", "--port", str(port)],
                                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), port)
    return procs


def wait_ready(procs: dict, *, tb_runs: dict[str, int], tb_timeout: float) -> None:
    for label, (proc, port) in procs.items():
        if label != "TensorBoard":
            wait_http(f"http://127.0.0.1:{port}/_stcore/health", proc, timeout=120)
    proc, port = procs["TensorBoard"]
    turl = f"http://127.0.0.1:{port}"
    # TensorBoard loads event files in the background: ready when every run lists its tags
    # with the last step written (its reservoir has read the whole file).
    wait_http(turl + "/data/plugin/scalars/tags", proc, timeout=tb_timeout,
              check=lambda b: len(json.loads(b)) >= len(tb_runs))
    for run, last in tb_runs.items():
        wait_http(turl + f"/data/plugin/scalars/scalars?run={urllib.parse.quote(run)}&tag=1_train/loss", proc,
                  timeout=tb_timeout, check=lambda b, last=last: bool(json.loads(b)) and json.loads(b)[-1][1] >= last)


def navigate(procs: dict, repeat: int) -> tuple[dict, dict, dict]:
    """Interleaved navigations (each server once per round) after one round that fills the servers'
    caches (reported apart: the first visit after a server starts); per server a list of
    (first, all, Chromium CPU s)."""
    from playwright.sync_api import sync_playwright

    timers = {"TensorBoard": time_tensorboard, "floor": time_floor}
    rows: dict = {label: [] for label in procs}
    cold: dict = {}
    counts: dict = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        for i in range(repeat + 1):
            for label, (_, port) in procs.items():
                shown, first, every, cpu, *more = timers.get(label, time_kforge)(browser, f"http://127.0.0.1:{port}")
                if i == 0:
                    cold[label] = (shown, first, every, cpu)
                else:
                    rows[label].append((shown, first, every, cpu))
                if more:
                    counts[label] = more[0]
        browser.close()
    return rows, cold, counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--steps", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--tb-load-timeout", type=float, default=1800.0)
    ap.add_argument("--root", type=Path, help="runs root to reuse (written there when absent, and kept)")
    ap.add_argument("--sample", action="store_true", help="the bundled sample_runs/ instead of synthetic runs")
    ap.add_argument("--baseline", type=Path,
                    help="another kforge source tree (e.g. `git archive` of the previous commit) served too, interleaved")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="kforge-bench-browser-") as tmp:
        root = args.root or Path(tmp) / "runs"
        if args.sample and not root.is_dir():
            ingest_sample(root)
        elif not args.sample and not (root / f"run{args.runs - 1}").is_dir():
            t = time.perf_counter()
            make_runs(root, args.runs, args.steps)
            print(f"wrote and exported {args.runs} runs x {args.steps:,} steps in {time.perf_counter() - t:.0f} s")
        tb_runs = tensorboard_runs(root)
        args.runs, args.steps = len(tb_runs), max(tb_runs.values())
        t_tb = time.perf_counter()
        procs = start_servers(root, Path(tmp), args.baseline)
        try:
            wait_ready(procs, tb_runs=tb_runs, tb_timeout=args.tb_load_timeout)
            tb_load = time.perf_counter() - t_tb
            load_before = os.getloadavg()[0]
            rows, cold, counts = navigate(procs, args.repeat)
        finally:
            for proc, _ in procs.values():
                proc.terminate()
                proc.wait(timeout=30)
    print_table(rows, counts, args, load=(load_before, os.getloadavg()[0]), tb_load=tb_load)
    print("first visit after the servers started (cold caches), on screen/interactive/all s: " +
          ", ".join(f"{label} {a:.2f}/{b:.2f}/{c:.2f}" for label, (a, b, c, _) in cold.items()))


def print_table(rows: dict, counts: dict, args, *, load: tuple[float, float], tb_load: float) -> None:
    med = {k: tuple(statistics.median(r[i] for r in v) for i in range(4)) for k, v in rows.items()}
    print(f"\n{args.runs} runs x {args.steps:,} steps, headless Chromium, median of {args.repeat} interleaved "
          f"navigations; 1-min load average {load[0]:.1f} before, {load[1]:.1f} after, on {os.cpu_count()} cores\n")
    print("| server | first chart on screen (s) | first interactive chart (s) | all charts drawn (s) | Chromium CPU (s) "
          "| charts |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    names = {
        "kforge-dash": f"kforge-dash (compare page, {args.runs} runs selected at landing)",
        "kforge-dash (baseline)": f"kforge-dash baseline ({args.baseline})",
        "TensorBoard": f"TensorBoard {tb_version()} (time series, its own server)",
        "floor": "Streamlit alone: one 3-point st.plotly_chart (Streamlit's own plotly chunk)",
    }
    charts = {label: str(n) for label, n in counts.items()}
    charts.update({"TensorBoard": f"{counts.get('TensorBoard')} shown at load", "floor": "1"})
    for label, (shown, first, every, cpu) in med.items():
        print(f"| {names[label]} | {shown:.2f} | {first:.2f} | {every:.2f} | {cpu:.2f} | {charts.get(label, '')} |")
    k, tb = med["kforge-dash"], med["TensorBoard"]
    print(f"| TensorBoard / kforge-dash | {tb[0] / k[0]:.2f}x | {tb[1] / k[1]:.2f}x | {tb[2] / k[2]:.2f}x | | |")
    if "kforge-dash (baseline)" in med:
        b = med["kforge-dash (baseline)"]
        print(f"| baseline / kforge-dash | {b[0] / k[0]:.2f}x | {b[1] / k[1]:.2f}x | {b[2] / k[2]:.2f}x "
              f"| {b[3] / k[3]:.2f}x | |")
    print(f"\nTensorBoard's own load of the event files before its first page (not in the times above): {tb_load:.0f} s")


def tb_version() -> str:
    import tensorboard

    return tensorboard.__version__


if __name__ == "__main__":
    main()
