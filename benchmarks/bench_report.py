"""kforge-report for 8 runs x 1M steps: time to build and the size of the one HTML file.

    python benchmarks/bench_report.py [--runs 8] [--steps 1000000]

Goal: under ~15 MB (plotly.js itself is about 4.6 MB of it), every planted spike in the file.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_dash import write_run  # noqa: E402

from kforge_dash.browse.report import ReportOptions, write_report  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--steps", type=int, default=1_000_000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="kforge-bench-report-") as tmp:
        root = Path(tmp) / "runs"
        for i in range(args.runs):
            out = root / f"run{i}" / "ingested"
            out.mkdir(parents=True)
            write_run(out / "steps.parquet", args.steps, seed=i)
            (out / "summary.json").write_text(json.dumps({
                "schema_version": "1.0", "run_name": f"run{i}", "steps": args.steps, "world_size": 64, "ranks": [],
                "attempts": [{"attempt": 0, "start_time": 1.7e9 + i}], "restarts": [], "tags": [],
                "hparams": {"seed": i}, "warnings": []}))
        rows = []
        for smoothing in (0.0, 0.6):
            t = time.perf_counter()
            report = write_report([root], Path(tmp) / "report.html", options=ReportOptions(smoothing=smoothing))
            rows.append((smoothing, time.perf_counter() - t, os.path.getsize(Path(tmp) / "report.html"),
                         report.html.count("Plotly.newPlot(")))
    print(f"\nkforge-report, {args.runs} runs x {args.steps:,} steps, 7 charts; 1-min load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (shared, noisy)\n")
    print("| smoothing | build + write (s) | file (MB) | charts |")
    print("| ---: | ---: | ---: | ---: |")
    for smoothing, secs, size, charts in rows:
        print(f"| {smoothing:g} | {secs:.1f} | {size / 1e6:.1f} | {charts} |")


if __name__ == "__main__":
    main()
