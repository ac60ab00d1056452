"""kforge-ingest against what a user would write instead (DuckDB), on the same run (issue 29, goal 1).

    pip install duckdb                                   # a benchmark dependency only, not kforge's
    python benchmarks/bench_ingest_vs_duckdb.py          # 64 ranks x 100k steps, median of 3
    python benchmarks/bench_ingest_vs_duckdb.py --quick  # 16 x 20k
    python benchmarks/bench_ingest_vs_duckdb.py --dir D  # write the run under D once, reuse it later
    python benchmarks/bench_ingest_vs_duckdb.py --old /work/main  # + that checkout's kforge-ingest, interleaved

The run is written by benchmarks/bench_ingest.py's generator (the recorder's format, 10k-step parts).
Each pipeline runs in a fresh interpreter under /usr/bin/time (peak RSS = its max resident set),
interleaved in an order that rotates each repeat; the table gives medians:

  duckdb aggregates   per-step mean loss / grad norm, max and median step time, the slowest rank
                      (arg_max), summed tokens -> steps.parquet
  duckdb + row copy   the same, plus a copy of every row to another Parquet file
  polars read+write   read every column of every part, write it back once (streaming sink)
  kforge-ingest       kforge-ingest --force --no-tensorboard --no-wandb (everything ingest derives)

rows/s/core = rank-step rows / wall / cores this process may use. "disk added" is the bytes
RUN/ingested holds after kforge-ingest, against the bytes of the shards' part files.
Every part file is listed explicitly (os.walk + kforge_record.schema.live_parts), never globbed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_ingest import write_run  # noqa: E402  (the one generator of bench runs)

from kforge_record.schema import live_parts  # noqa: E402

try:
    import duckdb  # noqa: F401  (only checked here; the children import it)
except ImportError:
    raise SystemExit("this benchmark needs DuckDB: pip install duckdb") from None

# argv: files.json, out dir. The rank is the folder name rank-NNNNN (the part files hold no rank column).
DUCK_AGG = """
import json, sys, duckdb
files = json.load(open(sys.argv[1]))
con = duckdb.connect()
src = "read_parquet($files, filename=true, union_by_name=true)"
con.execute(f'''COPY (SELECT step, avg(loss) AS loss, avg(grad_norm) AS grad_norm,
    max(step_time_s) AS step_time_max_s, median(step_time_s) AS step_time_median_s,
    arg_max(CAST(regexp_extract(filename, 'rank-([0-9]+)', 1) AS INTEGER), step_time_s) AS slowest_rank,
    sum(tokens) AS tokens
  FROM {src} GROUP BY step ORDER BY step) TO '{sys.argv[2]}/steps.parquet' (FORMAT parquet)''', {"files": files})
if len(sys.argv) > 3:
    con.execute(f"COPY (SELECT * FROM {src}) TO '{sys.argv[2]}/rows.parquet' (FORMAT parquet, COMPRESSION zstd)",
                {"files": files})
"""
POLARS_RW = """
import json, sys, polars as pl
files = json.load(open(sys.argv[1]))
pl.scan_parquet(files, glob=False).sink_parquet(sys.argv[2] + "/rows.parquet", compression="zstd")
"""
GLOB_CHARS = set("*?[]{}")


def part_files(run_dir: str) -> list[str]:
    out = []
    for root, dirs, names in os.walk(run_dir):
        dirs[:] = sorted(d for d in dirs if d != "ingested")
        out += [os.path.join(root, n) for n in live_parts(names)]
    bad = [p for p in out if GLOB_CHARS & set(p)]
    if bad:  # DuckDB expands globs in every path it is given: refuse rather than read other files
        raise SystemExit(f"path has glob characters, DuckDB would expand it: {bad[0]!r}")
    return out


def tree_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(r, n)) for r, _, names in os.walk(path) for n in names)


def timed(cmd: list[str], path: str | None = None) -> tuple[float, float]:
    """(wall s, peak RSS GiB) of a fresh process (``path``: its PYTHONPATH, a kforge checkout)."""
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", **({"PYTHONPATH": path} if path else {}))
    with tempfile.NamedTemporaryFile("r", suffix=".rss") as rss:
        t0 = time.perf_counter()
        # cwd: not a checkout, so PYTHONPATH decides which kforge runs (python -c puts cwd first)
        subprocess.run(["/usr/bin/time", "-f", "%M", "-o", rss.name, *cmd], check=True,
                       stdout=subprocess.DEVNULL, env=env, cwd=tempfile.gettempdir())
        wall = time.perf_counter() - t0
        return wall, int(rss.read().split()[-1]) / 2**20


def prepare(base: str, ranks: int, steps: int) -> tuple[str, int]:
    run = os.path.join(base, f"run-{ranks}x{steps}")
    done = run + ".written.json"  # beside the run: ingest never sees it
    if os.path.exists(done):
        with open(done) as f:
            return run, json.load(f)["rows"]
    shutil.rmtree(run, ignore_errors=True)  # a write a kill interrupted
    t0 = time.perf_counter()
    rows = write_run(run, ranks, steps, 10_000)
    with open(done, "w") as f:
        json.dump({"rows": rows}, f)
    print(f"# wrote {rows:,} rows in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return run, rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--quick", action="store_true", help="16 ranks x 20k steps")
    ap.add_argument("--repeat", type=int, default=3, help="interleaved repeats; the median is shown (default 3)")
    ap.add_argument("--dir", default=None, help="write (or reuse) the run here (default: a temp dir, deleted after)")
    ap.add_argument("--old", default=None, help="another kforge checkout whose kforge-ingest runs too, interleaved")
    args = ap.parse_args()
    if args.quick:
        args.ranks, args.steps = 16, 20_000
    base = args.dir or tempfile.mkdtemp(prefix="kforge-bench-duckdb-")
    os.makedirs(base, exist_ok=True)
    scratch = None
    try:
        run, rows = prepare(base, args.ranks, args.steps)
        files = part_files(run)
        scratch = tempfile.mkdtemp(prefix="out-", dir=base)
        listing = os.path.join(scratch, "files.json")
        with open(listing, "w") as f:
            json.dump(files, f)
        py = sys.executable
        ingest = [py, "-c", "from kforge_dash.cli.ingest import main; main()", "--force", "--no-tensorboard", "--no-wandb", run]
        pipelines = {
            "duckdb aggregates": [py, "-c", DUCK_AGG, listing, scratch],
            "duckdb + row copy": [py, "-c", DUCK_AGG, listing, scratch, "copy"],
            "polars read+write": [py, "-c", POLARS_RW, listing, scratch],
            "kforge-ingest": ingest,
        }
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        paths = {"kforge-ingest": here}
        if args.old:
            pipelines["kforge-ingest (old)"] = ingest
            paths["kforge-ingest (old)"] = os.path.abspath(args.old)
        names = list(pipelines)
        got = {n: [] for n in names}
        disk = {}
        for i in range(max(1, args.repeat)):
            for name in names[i % len(names):] + names[:i % len(names)]:  # rotating order
                got[name].append(timed(pipelines[name], paths.get(name)))
                if name in paths:
                    disk[name] = tree_bytes(os.path.join(run, "ingested"))
        cores = len(os.sched_getaffinity(0))
        shards = sum(os.path.getsize(p) for p in files)
        base_wall = statistics.median(w for w, _ in got["duckdb aggregates"])
        print(f"# {args.ranks} ranks x {args.steps:,} steps = {rows:,} rows in {len(files)} parts, {shards / 2**20:.0f} MiB; "
              f"{cores} cores; median of {args.repeat}; load average {os.getloadavg()[0]:.1f}")
        print("| pipeline | wall s | peak GiB | M rows/s/core | vs duckdb aggregates |")
        print("| --- | ---: | ---: | ---: | ---: |")
        for name in names:
            wall = statistics.median(w for w, _ in got[name])
            peak = max(m for _, m in got[name])
            print(f"| {name} | {wall:.2f} | {peak:.2f} | {rows / wall / cores / 1e6:.2f} | {base_wall / wall:.2f}x |")
        for name, added in disk.items():
            print(f"# disk added by {name}: {added / 2**20:.1f} MiB = {100 * added / shards:.1f} % of the shards' "
                  f"{shards / 2**20:.0f} MiB")
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)
        elif scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
