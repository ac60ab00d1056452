"""Compare view for 8 runs x 1M steps: downsampled (what kforge-dash draws) vs every point.

    python benchmarks/bench_dash.py [--runs 8] [--steps 1000000] [--repeat 3]

Writes synthetic ingested steps.parquet files (the contract's columns) to a temp dir, then times
prep_series.prepare_compare (scan, x axis, EMA smoothing, downsampling, markers) for the 7 default
charts, and, for the loss chart, building the plotly figure and serialising it to the JSON that
Streamlit sends to the browser. Goal: data preparation <= 1 s.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import plotly.io
import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from kforge_dash.browse import figures as prep_figures  # noqa: E402
from kforge_dash.browse import runs as prep_runs  # noqa: E402
from kforge_dash.browse import series as prep_series  # noqa: E402

METRICS = ["loss", "grad_norm", "lr", "tokens_per_sec", "mfu", "step_time_s", "mem_peak_bytes"]


def write_run(path: Path, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    step = np.arange(1, n + 1, dtype=np.int64)
    step_time = 0.5 + 0.02 * rng.random(n)
    loss = 2.0 + 8.0 / np.sqrt(step) + 0.05 * rng.standard_normal(n)
    loss[rng.integers(0, n)] = 25.0  # one spike
    loss[rng.integers(0, n)] = np.nan  # one NaN
    tokens = np.full(n, 4096 * 64, dtype=np.int64)
    pl.DataFrame({
        "step": step, "time": 1.7e9 + np.cumsum(step_time), "step_time_s": step_time,
        "slowest_rank": rng.integers(0, 64, n), "n_ranks": np.full(n, 64), "attempt": np.zeros(n, dtype=np.int64),
        "tokens": tokens, "tokens_per_sec": tokens / step_time, "mfu": 0.4 * 0.5 / step_time,
        "loss": loss, "grad_norm": 1.0 + 0.2 * rng.random(n),
        "lr": 3e-4 * np.minimum(1.0, step / 2000) * (0.1 + 0.9 * (1 + np.cos(np.pi * step / n)) / 2),
        "mem_peak_bytes": (60 * 2**30 + rng.integers(0, 2**28, n)).astype(np.int64),
    }).write_parquet(path)


def best_of(repeat: int, fn):
    """Best wall time and best CPU time (all threads) of `repeat` calls: on a shared machine the
    CPU time shows the work itself, the wall time what a user waited."""
    walls, cpus, out = [], [], None
    for _ in range(repeat):
        out = None
        w, c = time.perf_counter(), time.process_time()
        out = fn()
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
    return min(walls), min(cpus), out


def chart_payload(data, colours) -> tuple[float, int]:
    t = time.perf_counter()
    fig = prep_figures.metric_figure(data, "loss", colours)
    n_bytes = len(plotly.io.to_json(fig, validate=False))
    return time.perf_counter() - t, n_bytes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--steps", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="kforge-bench-dash-") as tmp:
        t = time.perf_counter()
        runs = []
        for i in range(args.runs):
            path = Path(tmp) / f"run{i}.parquet"
            write_run(path, args.steps, seed=i)
            runs.append(prep_series.RunSource(f"run{i}", path, {"attempts": [{"start_time": 1.7e9}]}))
        print(f"wrote {args.runs} runs x {args.steps:,} steps in {time.perf_counter() - t:.1f} s "
              f"({sum(os.path.getsize(r.steps_path) for r in runs) / 2**20:.0f} MiB); polars threads: "
              f"{pl.thread_pool_size()}, cores: {os.cpu_count()}")
        colours = prep_runs.run_colours([r.name for r in runs])
        rows = []
        per_line = prep_series.DEFAULT_POINTS
        for label, max_points, repeat in ((f"downsampled (MinMaxLTTB, {per_line:,}/series)", per_line, args.repeat),
                                          ("every point", None, 1)):
            prep_s, prep_cpu, data = best_of(repeat, lambda: prep_series.prepare_compare(
                runs, METRICS, x_axis="step", smoothing=0.6, max_points=max_points))
            chart_s, chart_bytes = chart_payload(data, colours)
            spikes_kept = sum(1 for s in data.series if s.metric == "loss" and s.kind == "raw" and np.max(s.y) == 25.0)
            rows.append((label, prep_s, prep_cpu, data.points(), chart_s, chart_bytes, spikes_kept))
            del data
    print(f"\ncompare view: {args.runs} runs x {args.steps:,} steps, {len(METRICS)} charts, raw + smoothed lines (lr and memory raw only)\n")
    head = ("variant", "data prep wall (s)", "data prep CPU (s)", "points to draw", "loss chart: build+JSON (s)", "loss chart JSON (MB)",
            "loss spikes drawn")
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join(["---"] * len(head)) + "|")
    for label, prep_s, prep_cpu, points, chart_s, chart_bytes, spikes in rows:
        print(f"| {label} | {prep_s:.3f} | {prep_cpu:.3f} | {points:,} | {chart_s:.3f} | {chart_bytes / 1e6:.1f} "
              f"| {spikes}/{args.runs} |")
    (_, p0, q0, n0, c0, b0, _), (_, p1, q1, n1, c1, b1, _) = rows
    print(f"| every point / downsampled | {p1 / p0:.1f}x | {q1 / q0:.1f}x | {n1 / n0:.0f}x | {c1 / c0:.0f}x "
          f"| {b1 / b0:.0f}x | |")
    load = os.getloadavg()[0]
    print(f"\ngoal: data prep <= 1 s wall -> {'met' if p0 <= 1.0 else 'NOT met'} ({p0:.3f} s wall, {q0:.3f} s CPU "
          f"on {os.cpu_count()} cores; 1-min load average {load:.1f} while measuring)")


if __name__ == "__main__":
    main()
