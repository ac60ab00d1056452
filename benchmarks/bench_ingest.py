"""kforge-ingest throughput and peak memory vs. a plain polars group-by floor, on the same files.

    python benchmarks/bench_ingest.py                      # 64x100k and 1024x100k (needs ~6 GB of /tmp)
    python benchmarks/bench_ingest.py --sizes 64x20000     # quick
    python benchmarks/bench_ingest.py --repeat 5           # median wall of 5 interleaved runs (shared machine)
    python benchmarks/bench_ingest.py --dask local:2       # also kforge-ingest --dask on the same files
    python benchmarks/bench_ingest.py --one-core           # also kforge-ingest under `taskset -c 0`
    python benchmarks/bench_ingest.py --compare-tree /work/main   # also another checkout's kforge-ingest
    python benchmarks/bench_ingest.py --sizes 64x20000 --steps-per-part 100 --merge   # the recorder's layout:
                                                           # as flushed, merged by its writer thread, 10k-step parts

Shards: meta.json/end.json come from real kforge_record.Recorder objects (one per rank); the part
files are written here with pyarrow directly, in the recorder's exact format (same columns, types,
zstd, the `kforge` key-value metadata, part-NNNNNN names), because pushing 100M rows through the
recorder's Python hot path would take longer than the benchmark. With --merge the same run is also
written a second time and merged as it goes by the recorder's own kforge_record.compact.Compactor
(called after every part, as the writer thread does), and every pipeline runs on both layouts. Every rank also logs an
`eval/loss` through log rows every 1000 steps, so ingest's log coalescing runs too.

Each pipeline runs in its own subprocess (fresh interpreter) so its peak RSS is its own.
The floor computes only max step time, summed tokens and tokens/s per step (scan -> group_by ->
collect with the streaming engine), reading 3 of the 15 columns; "read+write all" reads every
column and writes it back once with polars' streaming sink (the I/O that ranks.parquet alone
needs); kforge-ingest does everything (restart plan, log coalescing, min/median/slowest rank,
means of every scalar, MFU, EMAs, ranks.parquet + steps.parquet + summary.json).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from kforge_record import Recorder
from kforge_record.compact import Compactor
from kforge_record.schema import PARQUET_META_KEY, SCHEMA_VERSION, part_file_name


def write_run(run_dir: str, ranks: int, steps: int, steps_per_part: int, merge: bool = False) -> int:
    rng = np.random.default_rng(0)
    rows = 0
    for r in range(ranks):
        rec = Recorder(run_dir, rank=r, world_size=ranks, install_sigterm_handler=False,
                       model={"n_layers": 32, "dim": 4096, "n_heads": 32, "n_kv_heads": 32,
                              "ffn_hidden_dim": 11008, "vocab_size": 32000, "seq_len": 4096},
                       peak_tflops=989.0)
        rec.close()
        merger = Compactor(rec.attempt_dir, warn=_fail) if merge else None
        for i, lo in enumerate(range(1, steps + 1, steps_per_part)):
            step = np.arange(lo, min(lo + steps_per_part, steps + 1), dtype=np.int64)
            n = len(step)
            ev = step[step % 1000 == 0]  # log rows: step_time_s null, only eval/loss set
            st = 0.5 + 0.01 * rng.random(n)
            cols = {
                "step": np.concatenate([step, ev]),
                "time": np.concatenate([1.7e9 + step * 0.5, 1.7e9 + ev * 0.5 + 0.1]),
                "step_time_s": pa.array(np.concatenate([st, np.full(len(ev), np.nan)]),
                                        mask=np.r_[np.zeros(n, bool), np.ones(len(ev), bool)]),
                "loss": pa.array(np.r_[2.0 + rng.random(n), np.zeros(len(ev))], mask=np.r_[np.zeros(n, bool), np.ones(len(ev), bool)]),
                "grad_norm": pa.array(np.r_[rng.random(n), np.zeros(len(ev))], mask=np.r_[np.zeros(n, bool), np.ones(len(ev), bool)]),
                "lr": pa.array(np.r_[np.full(n, 3e-4), np.zeros(len(ev))], mask=np.r_[np.zeros(n, bool), np.ones(len(ev), bool)]),
                "tokens": pa.array(np.r_[np.full(n, 4096, np.int64), np.zeros(len(ev), np.int64)], mask=np.r_[np.zeros(n, bool), np.ones(len(ev), bool)]),
            }
            mem_mask = np.r_[(step - 1) % 10 != 0, np.ones(len(ev), bool)]  # memory_every_steps=10
            for c in ("mem_allocated_bytes", "mem_peak_bytes", "mem_reserved_bytes"):
                cols[c] = pa.array(np.full(n + len(ev), 40 << 30, np.int64), mask=mem_mask)
            for c in ("time/data_s", "time/fwd_bwd_s"):
                cols[c] = pa.array(np.r_[st / 2, np.zeros(len(ev))], mask=np.r_[np.zeros(n, bool), np.ones(len(ev), bool)])
            cols["eval/loss"] = pa.array(np.r_[np.zeros(n), 2.5 + rng.random(len(ev))], mask=np.r_[np.ones(n, bool), np.zeros(len(ev), bool)])
            table = pa.table(cols).replace_schema_metadata({PARQUET_META_KEY: json.dumps(
                {"schema_version": SCHEMA_VERSION, "rank": r, "attempt_id": rec.attempt_id, "dropped_rows_total": 0}).encode()})
            pq.write_table(table, os.path.join(rec.attempt_dir, part_file_name(i)), compression="zstd")
            rows += table.num_rows
            if merger is not None:
                merger.part_written(i, table.num_rows, table)
    return rows


def _fail(kind, message):
    raise SystemExit(f"merge failed: {message}")


def count_files(run_dir: str) -> int:
    return sum(n.endswith(".parquet") for _, _, names in os.walk(run_dir) for n in names)


FLOOR = """
import glob, sys, polars as pl
files = sorted(glob.glob(sys.argv[1] + "/rank-*/*/part-*.parquet"))
out = (pl.scan_parquet(files).group_by("step")
       .agg(pl.col("step_time_s").max(), pl.col("tokens").sum())
       .with_columns((pl.col("tokens") / pl.col("step_time_s")).alias("tokens_per_sec"))
       .collect(engine="streaming"))
print(out.height)
"""
# Not the floor, a second reference: read every column and write it back once (what
# ranks.parquet alone costs), to show how much of ingest's time is I/O the contract requires.
IO_FLOOR = """
import glob, os, sys, polars as pl
files = sorted(glob.glob(sys.argv[1] + "/rank-*/*/part-*.parquet"))
out = os.path.join(sys.argv[1], "io-floor.parquet")
pl.scan_parquet(files).sink_parquet(out, compression="zstd")
os.remove(out)
"""
INGEST = """
import sys
from kforge_dash.ingest.options import IngestOptions
from kforge_dash.ingest.run import ingest_run
res = ingest_run(sys.argv[1], options=IngestOptions(force=True))
print(res.summary["steps"])
"""
# The run window by window on the cluster (whole_run_bytes=0: one run is the case that needs it).
# Wall includes starting and stopping a local:N cluster; "WORKERS" is the largest worker's peak.
DASK = """
import sys, time
from kforge_dash.cluster import DaskOptions, dask_client, ingest_paths_dask
from kforge_dash.ingest.options import IngestOptions

def vmhwm():
    return int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM:")).split()[1])

if __name__ == "__main__":
    opts = DaskOptions(address=sys.argv[2], whole_run_bytes=0)
    with dask_client(opts) as client:
        t0 = time.perf_counter()
        res = ingest_paths_dask([sys.argv[1]], options=IngestOptions(force=True), exporters=[], client=client, opts=opts)
        assert res.ok and not res.failed, res.failed
        print("INGEST_S", time.perf_counter() - t0)
        print("WORKERS", max(client.run(vmhwm).values()))
"""


# The child's own peak: VmHWM from /proc. Not ru_maxrss: Linux carries it across fork/exec, so a
# child would report at least this (parent) process's size.
PEAK = """
import resource, sys
try:
    kib = int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM:")).split()[1])
except (OSError, StopIteration):
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // (1024 if sys.platform == "darwin" else 1)
print("MAXRSS", kib)
"""


def measure(code: str, run_dir: str, *args: str, prefix: tuple = (),
            tree: str | None = None) -> tuple[float, float, float]:
    """(wall seconds, peak RSS GiB, CPU seconds) of a fresh interpreter running ``code`` (its
    workers' largest peak when it prints one: a Dask run), with the checkout ``tree`` first on its
    path if given. CPU seconds (user + system, its child processes included; not a Dask cluster's)
    suffer less than wall from a busy machine."""
    wrapper = code + PEAK
    env = None if tree is None else dict(os.environ, PYTHONPATH=os.path.abspath(tree))
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run([*prefix, sys.executable, "-c", wrapper, run_dir, *args], capture_output=True, text=True,
                         check=True, env=env, cwd=None if tree is None else tempfile.gettempdir()).stdout
    wall = time.perf_counter() - t0
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    rss_kib = int(out.split("MAXRSS")[1].split()[0])
    if "WORKERS" in out:
        rss_kib = max(rss_kib, int(out.split("WORKERS")[1].split()[0]))
    return wall, rss_kib / 2**20, cpu


@dataclass(frozen=True)
class WrittenRun:
    path: str
    rows: int
    files: int


def _write_layouts(base: str, ranks: int, steps: int, layouts: list, *, keep: bool = False) -> dict[str, WrittenRun]:
    runs = {}
    for layout, per_part, merge in layouts:
        path = os.path.join(base, f"run-{ranks}x{steps}-{per_part}{'-merged' if merge else ''}")
        done = os.path.join(base, os.path.basename(path) + ".written.json")  # beside the run: ingest never sees it
        if keep and os.path.exists(done):
            with open(done) as f:
                runs[layout] = WrittenRun(path, **json.load(f))
            print(f"# {ranks}x{steps} {layout}: reused {runs[layout].rows:,} rows", file=sys.stderr)
            continue
        shutil.rmtree(path, ignore_errors=True)  # a write a kill interrupted
        t0 = time.perf_counter()
        rows = write_run(path, ranks, steps, per_part, merge)
        runs[layout] = WrittenRun(path, rows, count_files(path))
        if keep:
            with open(done, "w") as f:
                json.dump({"rows": rows, "files": runs[layout].files}, f)
        print(f"# {ranks}x{steps} {layout}: wrote {rows:,} rows in {time.perf_counter() - t0:.0f}s", file=sys.stderr)
    return runs


def _print_layout(size: str, layout: str, run: WrittenRun, got: dict) -> None:
    med = {name: (statistics.median(w for w, _, _ in r), max(m for _, m, _ in r), statistics.median(c for _, _, c in r))
           for name, r in got.items()}
    f_wall, f_mem, _ = med["polars floor"]
    o_wall, _, o_cpu = med["read+write all"]
    for name, (wall, mem, cpu) in med.items():
        print(f"{size:>12} {layout:>16} {run.files:>9,} {run.rows:>12,} {name:>15} {wall:>8.1f} {run.rows / wall:>12,.0f} "
              f"{mem:>9.2f} {(f_wall / wall):>14.2f}x {(mem / f_mem):>12.2f}x {(o_wall / wall):>10.2f}x "
              f"{cpu:>7.1f} {(o_cpu / cpu):>10.2f}x", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="64x100000,1024x100000", help="RANKSxSTEPS,... ")
    ap.add_argument("--steps-per-part", type=int, default=10_000)
    ap.add_argument("--dir", default=None, help="where to write shards (default: a temp dir, deleted after)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run the pipelines N times, interleaved (floor, read+write, ingest, floor, ...), and "
                         "report the median wall time and the largest peak (default 1)")
    ap.add_argument("--dask", default=None, metavar="ADDRESS", help="also time kforge-ingest --dask ADDRESS (e.g. local:2)")
    ap.add_argument("--one-core", action="store_true", help="also time kforge-ingest pinned to one core (taskset -c 0)")
    ap.add_argument("--compare-tree", default=None, metavar="PATH",
                    help="also time kforge-ingest from another checkout (PYTHONPATH=PATH, e.g. /work/main), "
                         "interleaved with this one's (and with --one-core, that checkout on one core too)")
    ap.add_argument("--merge", action="store_true",
                    help="write each run three times: in --steps-per-part parts, merged as they come as the "
                         "recorder's writer thread merges them, and in 10k-step parts; time every pipeline on each")
    ap.add_argument("--layouts", default=None, metavar="L,...",
                    help="instead of --merge's three layouts, only these of them: flushed, merged, 10k "
                         "(e.g. merged,10k for 1024x100000: 'flushed' is a million files there)")
    ap.add_argument("--keep", action="store_true",
                    help="with --dir: keep the written runs, and reuse those a previous --keep run completed")
    ap.add_argument("--write-only", action="store_true", help="with --keep: write the runs, time nothing (prepare data)")
    args = ap.parse_args()
    if args.keep and not args.dir:
        ap.error("--keep needs --dir")
    base = args.dir or tempfile.mkdtemp(prefix="kforge-bench-")
    # (label, steps per part, merged as it goes)
    layouts = [(f"{args.steps_per_part} steps/part", args.steps_per_part, False)]
    every = {"flushed": ("as flushed", args.steps_per_part, False), "merged": ("merged", args.steps_per_part, True),
             "10k": ("10k steps/part", 10_000, False)}
    if args.merge:
        layouts = list(every.values())
    if args.layouts:
        layouts = [every[name] for name in args.layouts.split(",")]
    pipelines = {"polars floor": (FLOOR, (), ()), "read+write all": (IO_FLOOR, (), ()), "kforge-ingest": (INGEST, (), ())}
    if args.one_core:
        pipelines["ingest 1 core"] = (INGEST, (), ("taskset", "-c", "0"))
    if args.compare_tree:
        other = os.path.basename(os.path.normpath(args.compare_tree))
        pipelines[f"ingest @{other}"] = (INGEST, (), (), args.compare_tree)
        if args.one_core:
            pipelines[f"@{other} 1 core"] = (INGEST, (), ("taskset", "-c", "0"), args.compare_tree)
    if args.dask:
        pipelines[f"--dask {args.dask}"] = (DASK, (args.dask,), ())
    print(f"{'case':>12} {'layout':>16} {'files':>9} {'rows':>12} {'pipeline':>15} {'wall s':>8} {'rows/s':>12} "
          f"{'peak GiB':>9} {'speed vs floor':>15} {'mem vs floor':>13} {'vs r+w all':>11} {'cpu s':>7} {'cpu vs r+w':>11}")
    try:
        for size in args.sizes.split(","):
            ranks, steps = map(int, size.lower().split("x"))
            runs = _write_layouts(base, ranks, steps, layouts, keep=args.keep)
            if args.write_only:
                continue
            got = {(layout, name): [] for layout in runs for name in pipelines}
            for _ in range(max(1, args.repeat)):
                for (layout, name), res in got.items():  # interleaved: a noisy neighbour hits every pipeline alike
                    code, extra, prefix, *tree = pipelines[name]
                    shutil.rmtree(os.path.join(runs[layout].path, "ingested"), ignore_errors=True)  # from scratch
                    res.append(measure(code, runs[layout].path, *extra, prefix=prefix, tree=(tree or [None])[0]))
            for layout, run in runs.items():
                _print_layout(size, layout, run, {name: got[(layout, name)] for name in pipelines})
                if not args.keep:
                    shutil.rmtree(run.path)
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
