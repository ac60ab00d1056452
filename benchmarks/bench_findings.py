#!/usr/bin/env python
"""What findings and goodput add to an ingest, side by side on the same outputs.

Writes a synthetic RUN/ingested/{steps,ranks}.parquet of RANKS x STEPS (phases data / fwd_bwd /
optimizer, one slow rank, a loss spike) and times, each in a fresh process (peak = its VmHWM):

  floor     one lazy polars pass over ranks.parquet (max step time per step): what any per-step
            fact over ranks costs at least
  findings  kforge_dash.findings.analyse_run: every detector and goodput (two lazy passes
            over ranks.parquet and a few small ones)

Medians of --repeat interleaved runs; CPU s is the process's CPU time over all its threads,
which a shared machine inflates less than wall time.

    python benchmarks/bench_findings.py --ranks 64 --steps 100000
    python benchmarks/bench_findings.py --hw-every 5   # with GPU telemetry on every 5th step (rank 3
                                                       # throttled in the middle third): hw_throttle, cause
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


def make(out: str, ranks: int, steps: int, hw_every: int = 0) -> None:
    import numpy as np
    import polars as pl

    rng = np.random.default_rng(0)
    step = np.repeat(np.arange(1, steps + 1), ranks)
    rank = np.tile(np.arange(ranks), steps)
    data = 0.01 + 0.001 * rng.random(step.size) + np.where(rank == 3, 0.05, 0.0)
    fwd = 0.2 + 0.01 * rng.random(step.size)
    slowest = 0.061 + 0.211
    fwd = fwd + (slowest - data - fwd).clip(0)  # the others wait for rank 3 in the all-reduce
    opt = 0.01 + 0.001 * rng.random(step.size)
    st = data + fwd + opt
    t0 = 1.8e9
    time_ = t0 + step * 0.3
    loss = 2.0 + 0.01 * rng.standard_normal(step.size)
    loss[(step >= steps // 2) & (step < steps // 2 + 3)] *= 2
    ranks_df = pl.DataFrame({"step": step, "rank": rank, "attempt": np.zeros(step.size, dtype=np.int64), "time": time_,
                             "step_time_s": st, "loss": loss, "grad_norm": 0.5 + 0.01 * rng.random(step.size),
                             "time/data_s": data, "time/fwd_bwd_s": fwd, "time/optimizer_s": opt})
    hw = []
    if hw_every:  # telemetry on every hw_every-th step, null elsewhere; rank 3 throttled in the middle third
        on = step % hw_every == 0
        hot = (rank == 3) & (step > steps // 3) & (step <= 2 * steps // 3)
        hw = ["hw/sm_clock_mhz", "hw/throttle_reasons", "hw/gpu_temp_c"]
        ranks_df = ranks_df.with_columns(
            pl.when(pl.Series(on)).then(pl.Series(np.where(hot, 1200.0, 1980.0))).alias("hw/sm_clock_mhz"),
            pl.when(pl.Series(on)).then(pl.Series(np.where(hot, 68.0, 4.0))).alias("hw/throttle_reasons"),
            pl.when(pl.Series(on)).then(pl.Series(np.where(hot, 91.0, 70.0))).alias("hw/gpu_temp_c"))
    ranks_df.write_parquet(os.path.join(out, "ranks.parquet"))
    steps_df = ranks_df.group_by("step").agg(
        *[pl.col(c).mean() for c in hw],
        pl.col("time").max(), pl.col("step_time_s").max(), pl.col("step_time_s").max().alias("step_work_s"),
        pl.col("step_time_s").min().alias("step_work_min_s"), pl.col("step_time_s").median().alias("step_work_median_s"), pl.col("attempt").first(),
        pl.col("loss").mean(), pl.col("grad_norm").first(), pl.lit(None, pl.Int64).alias("mem_allocated_bytes"),
        pl.col("time/data_s").mean(), pl.col("time/fwd_bwd_s").mean(), pl.col("time/optimizer_s").mean(),
    ).sort("step")
    steps_df.write_parquet(os.path.join(out, "steps.parquet"))


def child(which: str, out: str, ranks: int) -> None:
    import polars as pl

    t, c = time.perf_counter(), time.process_time()
    if which == "floor":
        pl.scan_parquet(os.path.join(out, "ranks.parquet")).group_by("step").agg(pl.col("step_time_s").max()).collect()
    else:
        from kforge_dash.findings import FindingsOptions, analyse_run
        from kforge_dash.ingest.inputs.launches import Launch
        from kforge_dash.ingest.inputs.shards import Attempt

        steps = pl.read_parquet(os.path.join(out, "steps.parquet"))
        L = Launch(0, [Attempt(r, "a", out, {"host": f"node{r // 8}"}, True, 1.8e9, None) for r in range(ranks)])
        summary = {"ranks": list(range(ranks)), "attempts": [{"attempt": 0, "first_step": 1,
                                                              "last_step": steps.height}], "restarts": []}
        res = analyse_run(out, steps, [L], summary, FindingsOptions(), [])
        assert any(f["kind"] == "straggler" and f["ranks"] == [3] for f in res["findings"]), res["findings"]
        if "hw/sm_clock_mhz" in steps.columns:
            assert any(f["kind"] == "hw_throttle" and f["ranks"] == [3] for f in res["findings"]), res["findings"]
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    with open("/proc/self/status") as f:
        hwm = next(int(x.split()[1]) for x in f if x.startswith("VmHWM")) / 2**20
    print(json.dumps({"wall": wall, "cpu": cpu, "peak_gib": hwm}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=64)
    p.add_argument("--steps", type=int, default=20000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--hw-every", type=int, default=0, help="GPU telemetry columns on every N-th step (0: none)")
    p.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        return child(a.child[0], a.child[1], int(a.child[2]))
    with tempfile.TemporaryDirectory(prefix="kforge-bench-findings-") as out:
        make(out, a.ranks, a.steps, a.hw_every)
        res = {"floor": [], "findings": []}
        env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
        for _ in range(a.repeat):
            for which in res:
                r = subprocess.run([sys.executable, __file__, "--child", which, out, str(a.ranks)], env=env,
                                   capture_output=True, text=True, check=True)
                res[which].append(json.loads(r.stdout.strip().splitlines()[-1]))
    rows = a.ranks * a.steps
    floor = statistics.median(x["wall"] for x in res["floor"])
    print(f"{a.ranks} ranks x {a.steps:,} steps = {rows:,} rows of ranks.parquet, medians of {a.repeat}"
          f"{f', GPU telemetry every {a.hw_every} steps' if a.hw_every else ''}\n")
    cpu_floor = statistics.median(x["cpu"] for x in res["floor"])
    print("| pipeline | wall s | CPU s (all threads) | peak GiB | wall x floor | CPU x floor |\n"
          "| --- | ---: | ---: | ---: | ---: | ---: |")
    for which, xs in res.items():
        w = statistics.median(x["wall"] for x in xs)
        c = statistics.median(x["cpu"] for x in xs)
        pk = statistics.median(x["peak_gib"] for x in xs)
        print(f"| {which} | {w:.2f} | {c:.2f} | {pk:.2f} | {w / floor:.1f}x | {c / cpu_floor:.1f}x |")


if __name__ == "__main__":
    main()
