"""kforge-ingest --dask vs a local ingest on the same run: wall, what the driver receives, and the
costs docs/scale.md's cluster estimate is built from (issue 29, goal 3).

    python benchmarks/bench_dask.py                            # 64x100000, local:2, 5 interleaved repeats
    python benchmarks/bench_dask.py --size 64x50000 --repeat 3 --dask local:2
    python benchmarks/bench_dask.py --steps-per-part 1000 --chunk-rows 64000   # 100 windows, the same bytes

The run is bench_ingest.py's (its write_run: the recorder's format, 10k-step parts). Each pipeline
runs in a fresh interpreter, alternately (a noisy neighbour hits both alike); medians are shown.

* local: ingest_run, as `kforge-ingest RUN` runs it. CPU: the process and its children (footer workers).
* dask: ingest_paths_dask on a LocalCluster started before the clock (whole_run_bytes=0: window by
  window). Wall: the ingest only. Driver CPU: this process over the ingest, which for local:N also
  holds the scheduler (so an upper bound of the driver's own). Worker CPU: each window's worker
  process CPU (IngestResult.driver, ingest/shipped.py), per row. Driver bytes: the windows'
  results as shipped (pickled, protocol 5), split, over the rows' own Arrow bytes.
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_ingest import write_run  # noqa: E402  (the benchmark's run generator)

LOCAL = """
import json, resource, sys, time
from kforge_dash.ingest.options import IngestOptions
from kforge_dash.ingest.run import ingest_run

def cpu():
    return sum(resource.getrusage(w).ru_utime + resource.getrusage(w).ru_stime
               for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))

c0, t0 = cpu(), time.perf_counter()
res = ingest_run(sys.argv[1], options=IngestOptions(force=True, chunk_rows=int(sys.argv[2])))
print(json.dumps({"wall": time.perf_counter() - t0, "cpu": cpu() - c0}))
"""
DASK = """
import json, resource, sys, time
from kforge_dash.cluster import DaskOptions, dask_client, ingest_paths_dask
from kforge_dash.ingest.options import IngestOptions

def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime

if __name__ == "__main__":
    opts = DaskOptions(address=sys.argv[2], whole_run_bytes=0)
    with dask_client(opts) as client:
        client.wait_for_workers(opts.local_workers or 1, timeout=60)
        c0, t0 = cpu(), time.perf_counter()
        res = ingest_paths_dask([sys.argv[1]], options=IngestOptions(force=True, chunk_rows=int(sys.argv[3])),
                                exporters=[], client=client, opts=opts)
        wall, driver_cpu = time.perf_counter() - t0, cpu() - c0
        assert res.ok and not res.failed, res.failed
        print(json.dumps({"wall": wall, "driver_cpu": driver_cpu, **res.ok[0].driver.to_dict()}))
"""


def run_child(code: str, *args: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def mib(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="64x100000", help="RANKSxSTEPS (default 64x100000)")
    ap.add_argument("--steps-per-part", type=int, default=10_000)
    ap.add_argument("--dask", default="local:2", metavar="ADDRESS")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--chunk-rows", type=int, default=1_000_000,
                    help="rows a window (IngestOptions.chunk_rows): fewer, more windows for the same bytes, "
                         "which tells the driver's cost a window from its cost a byte")
    args = ap.parse_args()
    ranks, steps = map(int, args.size.lower().split("x"))
    base = tempfile.mkdtemp(prefix="kforge-bench-dask-")
    try:
        run = os.path.join(base, "run")
        rows = write_run(run, ranks, steps, args.steps_per_part)
        print(f"# {args.size}: {rows:,} rows in {args.steps_per_part}-step parts; load: {os.getloadavg()}",
              file=sys.stderr)
        local, dask = [], []
        for _ in range(args.repeat):  # interleaved
            for got, code, extra in ((local, LOCAL, (str(args.chunk_rows),)),
                                     (dask, DASK, (args.dask, str(args.chunk_rows)))):
                shutil.rmtree(os.path.join(run, "ingested"), ignore_errors=True)
                got.append(run_child(code, run, *extra))
        report(args, rows, local, dask)
        print(f"# load after: {os.getloadavg()}", file=sys.stderr)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def report(args, rows: int, local: list[dict], dask: list[dict]) -> None:
    def med(xs, key):
        return statistics.median(x[key] for x in xs)

    d = dask[-1]  # bytes and counts are the same every repeat
    n = d["n_rows"]
    print(f"{'':<34} {'local':>14} {'--dask ' + args.dask:>16}")
    print(f"{'wall s (median of ' + str(args.repeat) + ')':<34} {med(local, 'wall'):>14.2f} {med(dask, 'wall'):>16.2f}"
          f"   ({med(dask, 'wall') / med(local, 'wall'):.2f}x)")
    print(f"{'CPU µs a row (local: all; dask: workers)':<34} {1e6 * med(local, 'cpu') / n:>14.3f} "
          f"{1e6 * med(dask, 'worker_cpu_s') / n:>16.3f}")
    print(f"{'worker wall s a window':<34} {'':>14} {med(dask, 'worker_wall_s') / d['windows']:>16.3f}")
    print(f"{'windows':<34} {'':>14} {d['windows']:>16}")
    print(f"{'driver CPU s a window (+scheduler)':<34} {'':>14} {med(dask, 'driver_cpu') / d['windows']:>16.3f}")
    print(f"{'driver busy s a window (wall)':<34} {'':>14} {med(dask, 'driver_s') / d['windows']:>16.3f}")
    print(f"{'driver received':<34} {'':>14} {mib(d['received']):>16}   ({100 * d['fraction']:.1f} % of the "
          f"rows' {mib(d['rows_arrow'])}, {d['rows_arrow'] / n:.0f} B a row)")
    for k in ("rows", "steps", "periods", "other"):
        print(f"{'  ' + k:<34} {'':>14} {mib(d[k]):>16}   ({100 * d[k] / d['rows_arrow']:.2f} %)")
    print(f"# rows {rows:,} written, {n:,} in ranks.parquet")


if __name__ == "__main__":
    main()
