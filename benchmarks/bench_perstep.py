#!/usr/bin/env python
"""findings.perstep.per_step by each of its ways, side by side on the same ranks.parquet.

Writes ranks.parquet as ingest lays it out (row-pass windows of about 1M rows, rank by rank, each
window in row groups of whole ranks of about 1M rows) and times ``per_step`` in a fresh process
per (case, way), interleaved, medians of --repeat; CPU s is the process's CPU time over all its
threads (a shared machine inflates it less than wall time):

  units    grid_units.py: row group by row group (only when the run is one full grid)
  windows  step windows as numpy matrices (matrix.Window), grid_units off
  grouped  step windows through polars' group-by (_grouped, _blocks_grouped), matrices off
  units-1t, windows-1t   the same on one perstep thread (not by default: what the two threads save)
  units-fresh, windows-fresh   the same with fresh numpy arrays for every window (not by default:
           what reusing ingest.buffers.Buffers saves)

Cases: ``grid64``  64 ranks x 100k steps (windows of 15,625 steps, one row group each);
``grid1024``  1,024 ranks x 10k steps (one row-pass window, row groups of 100 ranks x 10k steps:
a step window cuts across all of them); ``restart``  64 ranks x 50k steps, a restart (attempt 1)
at step 25,001, rank 5 missing every 7th step of attempt 0 (not a grid: no units).

    python benchmarks/bench_perstep.py --repeat 3
    python benchmarks/bench_perstep.py --cases grid1024 --ways units windows
    python benchmarks/bench_perstep.py --cases grid64 --ways units units-1t windows windows-1t
    python benchmarks/bench_perstep.py --ways units units-fresh windows windows-fresh
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
CASES = {"grid64": (64, 100_000, 15_625), "grid1024": (1024, 10_000, 10_000), "restart": (64, 50_000, 15_625)}
WAYS = ("units", "windows", "grouped", "units-1t", "windows-1t", "units-fresh", "windows-fresh")
OWN = ("time/data_s", "time/optimizer_s")


def make(out: str, case: str) -> None:
    import numpy as np
    import polars as pl
    import pyarrow as pa
    import pyarrow.parquet as pq

    ranks, steps, span = CASES[case]
    rng = np.random.default_rng(0)
    w = None
    meds = []
    per_group = max(1, (1 << 20) // span)  # whole ranks a row group
    for lo in range(1, steps + 1, span):
        k = min(span, steps + 1 - lo)
        for r0 in range(0, ranks, per_group):
            rk = np.arange(r0, min(ranks, r0 + per_group))
            step = np.tile(np.arange(lo, lo + k), len(rk))
            rank = np.repeat(rk, k)
            attempt = np.zeros(step.size, dtype=np.int64)
            if case == "restart":
                attempt = (step > steps // 2).astype(np.int64)
                keep = ~((rank == 5) & (attempt == 0) & (step % 7 == 0))
                step, rank, attempt = step[keep], rank[keep], attempt[keep]
            n = step.size
            data = 0.01 + 0.001 * rng.random(n) + np.where(rank == 3, 0.05, 0.0)
            fwd = 0.2 + 0.01 * rng.random(n)
            fwd = fwd + (0.272 - data - fwd).clip(0)
            opt = 0.01 + 0.001 * rng.random(n)
            t = pa.table({"step": step, "rank": rank, "attempt": attempt, "step_time_s": data + fwd + opt,
                          "time/data_s": data, "time/fwd_bwd_s": fwd, "time/optimizer_s": opt})
            if w is None:
                w = pq.ParquetWriter(os.path.join(out, "ranks.parquet"), t.schema, compression="lz4",
                                     use_dictionary=["step", "rank", "attempt"],
                                     write_statistics=["step", "rank", "attempt"])
            w.write_table(t, row_group_size=1 << 20)
            meds.append(pl.from_arrow(t).group_by("step").agg(pl.col("step_time_s").median().alias("step_work_median_s")))
    w.close()
    pl.concat(meds).group_by("step").agg(pl.col("step_work_median_s").first()).sort("step").write_parquet(
        os.path.join(out, "steps.parquet"))


def child(case: str, way: str, out: str) -> None:
    import polars as pl

    from kforge_dash.findings import grid_units, perstep
    from kforge_dash.findings.finding import Phases, RunFacts
    from kforge_dash.findings.matrix import Window
    from kforge_dash.findings.thresholds import FindingsOptions

    if way.endswith("-fresh"):
        import numpy as np

        from kforge_dash.ingest.rowpass.buffers import Buffers
        Buffers.get = lambda self, role, dtype, shape: np.empty(shape, dtype)
        way = way[:-6]
    if way.endswith("-1t"):
        perstep.usable_cpus = lambda: 1
        way = way[:-3]
    if way != "units":
        grid_units.plan = lambda path: None
    if way == "grouped":
        Window.of = classmethod(lambda cls, df, buf=None, **kw: None)
    ph = Phases(own=OWN, wait=("time/fwd_bwd_s",), data=("time/data_s",), checkpoint=(), eval=())
    steps = pl.read_parquet(os.path.join(out, "steps.parquet"))
    facts = RunFacts(steps=steps, ranks_path=os.path.join(out, "ranks.parquet"), launches=[],
                     summary={"ranks": list(range(CASES[case][0]))}, opts=FindingsOptions(), phases=ph)
    took = []
    by_units = perstep._by_units
    perstep._by_units = lambda *a: took.append(by_units(*a)) or took[-1]
    t, c = time.perf_counter(), time.process_time()
    med, blk = perstep.per_step(facts)
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    assert med.height == steps.height, (med.height, steps.height)
    assert (took[0] is not None) == (way == "units"), "the way taken is not the way asked for"
    with open("/proc/self/status") as f:
        hwm = next(int(x.split()[1]) for x in f if x.startswith("VmHWM")) / 2**20
    print(json.dumps({"wall": wall, "cpu": cpu, "peak_gib": hwm, "blocks": blk.height}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    p.add_argument("--ways", nargs="+", default=list(WAYS[:3]), choices=list(WAYS))
    p.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        return child(*a.child)
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    print("| case | way | wall s | CPU s | peak GiB | wall x first | CPU x first |\n| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for case in a.cases:
        ways = [w for w in a.ways if not (case == "restart" and w.startswith("units"))]
        with tempfile.TemporaryDirectory(prefix="kforge-bench-perstep-") as out:
            make(out, case)
            res = {w: [] for w in ways}
            for _ in range(a.repeat):
                for way in ways:
                    r = subprocess.run([sys.executable, __file__, "--child", case, way, out], env=env,
                                       capture_output=True, text=True, check=True)
                    res[way].append(json.loads(r.stdout.strip().splitlines()[-1]))
        base = statistics.median(x["cpu"] for x in res[ways[0]])
        wbase = statistics.median(x["wall"] for x in res[ways[0]])
        for way, xs in res.items():
            c, w = statistics.median(x["cpu"] for x in xs), statistics.median(x["wall"] for x in xs)
            print(f"| {case} | {way} | {w:.2f} | {c:.2f} | {statistics.median(x['peak_gib'] for x in xs):.2f} | "
                  f"{w / wbase:.2f}x | {c / base:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
