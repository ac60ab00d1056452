"""Re-ingest after new part files arrive (what `kforge-ingest --watch` does each poll) vs. a full ingest.

    python benchmarks/bench_ingest_watch.py                   # 64x100k + 1000 steps (~1 GB of /tmp, 64k part files)
    python benchmarks/bench_ingest_watch.py --sizes 8x5000    # quick (seconds)
    python benchmarks/bench_ingest_watch.py --sizes 64x20000 --repeat 3 --append-steps 500
    python benchmarks/bench_ingest_watch.py --sizes 8x5000 --log-rows next-part   # the recorder's own log-row layout
    python benchmarks/bench_ingest_watch.py --sizes 64x99500 --merge   # parts merged as the recorder's writer does

For each RANKSxSTEPS size:

1. A synthetic live run is written: RANKS ranks, steps 1..STEPS, in part files of --steps-per-part
   steps (default 100, the recorder's default flush_every_steps: the layout a real job leaves).
   meta.json comes from a real kforge_record.Recorder per rank; its end.json is removed, since a
   job that is still running has none. Part files are written with pyarrow in the recorder's exact
   format (as in bench_ingest.py: same columns, types, zstd, `kforge` key-value metadata,
   part-NNNNNN names), with Recorder.log rows carrying `eval/loss` every 1000 steps: at the end of
   the part that ends the step, or with --log-rows next-part at the start of the next part, where a
   real Recorder puts a log() that follows the flush (then the first appended part carries the
   eval of the last step ingested before the append, when STEPS is a multiple of 1000).
   With --merge every rank's parts are merged as they are written by the recorder's own
   kforge_record.compact.Compactor (as its writer thread does), also during step 3: with STEPS
   not a multiple of 100k, the appended parts then complete merges of parts the first ingest
   read (e.g. 64x99500: flushes 990-999 merge, then 900-999, then 0-999), which an append must
   take as old rows, not as changed parts.
2. "first ingest": ingest_run(run) from nothing, timed once. RUN/ingested/ is then copied aside.
3. --append-steps more steps (default 1000) are written to every rank as further part files in its
   attempt folder (numbering continued), as a live job does between two --watch polls.
4. Interleaved over --repeat rounds, each in a fresh interpreter (wall seconds, peak RSS = the
   child's VmHWM):
   (a) "re-ingest (watch)": ingest_run(run), starting every time from the outputs saved in step 2
       (RUN/ingested/ is restored from the copy, mtimes kept): ingest appends the new parts to the
       last outputs when it can; whether it did (IngestResult.appended) is printed;
   (b) "full re-ingest": ingest_run(run, IngestOptions(force=True)) with RUN/ingested/ deleted first.
   The table gives the median wall time, the largest peak and full/incremental ("x faster").
5. The outputs of the first (a) and (b) are compared: steps.parquet equal (null-aware), ranks.parquet
   equal once both are sorted by (rank, step), summary.json equal except ingested_at, fingerprint and
   exports (warnings compared as sorted lists). Any difference is printed and the exit status is 1.

A markdown version of the table is printed at the end.
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

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from bench_ingest import PEAK  # the child's own peak (VmHWM), as bench_ingest measures it

from kforge_dash.contract import INGESTED_DIR, RANKS_FILE, STEPS_FILE, SUMMARY_FILE
from kforge_record import Recorder
from kforge_record.compact import Compactor
from kforge_record.schema import END_FILE, PARQUET_META_KEY, SCHEMA_VERSION, part_file_name, part_span, rank_dir_name

OUTPUTS = (STEPS_FILE, RANKS_FILE, SUMMARY_FILE)
SUMMARY_IGNORED = ("ingested_at", "fingerprint", "exports")

INCREMENTAL = """
import sys
from kforge_dash.ingest.run import ingest_run
res = ingest_run(sys.argv[1])
print("STEPS", res.summary["steps"], "SKIPPED", int(res.skipped), "APPENDED", getattr(res, "appended", None))
"""
FULL = INCREMENTAL.replace("import sys\n", "import sys\nfrom kforge_dash.ingest.options import IngestOptions\n").replace(
    "ingest_run(sys.argv[1])", "ingest_run(sys.argv[1], options=IngestOptions(force=True))")


def _attempt_dir(run_dir: str, rank: int, ranks: int) -> str:
    """The rank's one attempt folder; made by a real Recorder (meta.json) when the rank has none yet."""
    rank_dir = os.path.join(run_dir, rank_dir_name(rank))
    if not os.path.isdir(rank_dir):
        rec = Recorder(run_dir, rank=rank, world_size=ranks, install_sigterm_handler=False,
                       model={"n_layers": 32, "dim": 4096, "n_heads": 32, "n_kv_heads": 32,
                              "ffn_hidden_dim": 11008, "vocab_size": 32000, "seq_len": 4096},
                       peak_tflops=989.0)
        rec.close()
        os.remove(os.path.join(rec.attempt_dir, END_FILE))  # a live job has no end.json yet
        return rec.attempt_dir
    (att,) = [e.path for e in os.scandir(rank_dir) if e.is_dir()]
    return att


def _fail(kind, message):
    sys.exit(f"merge failed: {message}")


def write_steps(run_dir: str, ranks: int, lo: int, hi: int, steps_per_part: int,
                log_next_part: bool = False, mergers: dict | None = None) -> tuple[int, int]:
    """Write steps [lo, hi) of every rank as part files after the ones already there.
    Returns (rows, files) written. The columns are bench_ingest.write_run's.

    ``log_next_part``: the eval log row of step S (S % 1000 == 0) opens the part after the one
    that ends S, as a real Recorder writes it when rec.log(S, ...) follows the flush at end_step(S);
    by default it closes the same part (bench_ingest.py's layout).

    ``mergers``: rank -> its Compactor (made on first use), which merges the parts as they come."""
    rng = np.random.default_rng(lo)
    rows = files = 0
    for r in range(ranks):
        att = _attempt_dir(run_dir, r, ranks)
        spans = [part_span(n) for n in os.listdir(att)]
        first = max((sp.last for sp in spans if sp is not None), default=-1) + 1  # the next flush
        merger = None if mergers is None else mergers.setdefault(r, Compactor(att, warn=_fail))
        for i, s0 in enumerate(range(lo, hi, steps_per_part), start=first):
            step = np.arange(s0, min(s0 + steps_per_part, hi), dtype=np.int64)
            ev = step[step % 1000 == 0]  # log rows: step_time_s null, only eval/loss set
            if log_next_part:
                ev = np.array([s0 - 1] if s0 > 1 and (s0 - 1) % 1000 == 0 else [], np.int64)
            n, k = len(step), len(ev)
            st = 0.5 + 0.01 * rng.random(n)
            ended = np.r_[np.ones(n, bool), np.zeros(k, bool)]  # rows from end_step, then log rows

            def col(values, valid=ended):  # n end_step values, then k nulls (by default)
                return pa.array(np.r_[values, np.zeros(k, np.asarray(values).dtype)], mask=~valid)
            cols = {
                "step": np.r_[step, ev],
                "time": np.r_[1.7e9 + step * 0.5, 1.7e9 + ev * 0.5 + 0.1],
                "step_time_s": col(st),
                "loss": col(2.0 + rng.random(n)),
                "grad_norm": col(rng.random(n)),
                "lr": col(np.full(n, 3e-4)),
                "tokens": col(np.full(n, 4096, np.int64)),
            }
            mem_valid = np.r_[(step - 1) % 10 == 0, np.zeros(k, bool)]  # memory_every_steps=10
            for c in ("mem_allocated_bytes", "mem_peak_bytes", "mem_reserved_bytes"):
                cols[c] = col(np.full(n, 40 << 30, np.int64), mem_valid)
            for c in ("time/data_s", "time/fwd_bwd_s"):
                cols[c] = col(st / 2)
            cols["eval/loss"] = pa.array(np.r_[np.zeros(n), 2.5 + rng.random(k)], mask=ended)
            table = pa.table(cols)
            if log_next_part:  # the log row first, then the steps
                table = table.take(np.r_[np.arange(n, n + k), np.arange(n)])
            table = table.replace_schema_metadata({PARQUET_META_KEY: json.dumps(
                {"schema_version": SCHEMA_VERSION, "rank": r, "attempt_id": os.path.basename(att),
                 "dropped_rows_total": 0}).encode()})
            pq.write_table(table, os.path.join(att, part_file_name(i)), compression="zstd")
            rows += table.num_rows
            files += 1
            if merger is not None:
                merger.part_written(i, table.num_rows, table)
    return rows, files


def measure(code: str, run_dir: str) -> tuple[float, float, str]:
    """(wall seconds, peak RSS GiB, stdout) of a fresh interpreter running ``code``."""
    wrapper = code + PEAK
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", wrapper, run_dir], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode:
        sys.exit(f"ingest failed (exit {p.returncode}):\n{p.stderr}")
    return wall, int(p.stdout.split("MAXRSS")[1].split()[0]) / 2**20, p.stdout


def check_ingest(out: str, steps: int) -> str:
    """Exit unless the ingest gave ``steps`` steps and was not skipped; IngestResult.appended
    ("True": only the new parts were read, "False", or "None" before ingest could append)."""
    got = out.split()
    n, skipped = int(got[got.index("STEPS") + 1]), bool(int(got[got.index("SKIPPED") + 1]))
    if n != steps or skipped:
        sys.exit(f"unexpected ingest result: {n} steps (want {steps}), skipped={skipped}")
    return got[got.index("APPENDED") + 1]


def diff_frames(name: str, a: pl.DataFrame, b: pl.DataFrame) -> list[str]:
    """What differs between two frames (empty when equal): columns, dtypes, heights, which columns' values."""
    if a.schema == b.schema and a.equals(b, null_equal=True):
        return []
    out = []
    if a.columns != b.columns:
        out.append(f"{name}: columns differ: only re-ingest {sorted(set(a.columns) - set(b.columns))}, "
                   f"only full {sorted(set(b.columns) - set(a.columns))}"
                   + (", same set in another order" if set(a.columns) == set(b.columns) else ""))
    common = [c for c in a.columns if c in b.columns]
    types = [f"{c} ({a[c].dtype} vs {b[c].dtype})" for c in common if a[c].dtype != b[c].dtype]
    if types:
        out.append(f"{name}: dtypes differ: {', '.join(types)}")
    if a.height != b.height:
        out.append(f"{name}: {a.height} rows after re-ingest, {b.height} after full ingest")
        return out
    vals = []
    for c in common:
        x, y = a[c], b[c]
        if x.equals(y, null_equal=True):
            continue
        bad = int((x.ne_missing(y.cast(x.dtype, strict=False))).sum())
        what = f"{c} ({bad} rows"
        if x.dtype.is_numeric() and y.dtype.is_numeric():
            d = (x.cast(pl.Float64) - y.cast(pl.Float64)).abs().max()  # None when only nulls differ
            what += f", max |diff| {d:.3g}" if d else ""
        vals.append(what + ")")
    if vals:
        out.append(f"{name}: values differ in {', '.join(vals)}")
    return out or [f"{name}: differ (schema order or metadata)"]


def compare(dir_a: str, dir_b: str) -> list[str]:
    """Differences between the outputs in dir_a (re-ingest) and dir_b (full ingest)."""
    diffs = diff_frames(STEPS_FILE, pl.read_parquet(os.path.join(dir_a, STEPS_FILE)),
                        pl.read_parquet(os.path.join(dir_b, STEPS_FILE)))
    diffs += diff_frames(RANKS_FILE + " (sorted by rank, step)",
                         pl.read_parquet(os.path.join(dir_a, RANKS_FILE)).sort("rank", "step", maintain_order=True),
                         pl.read_parquet(os.path.join(dir_b, RANKS_FILE)).sort("rank", "step", maintain_order=True))
    sa, sb = ({k: v for k, v in json.load(open(os.path.join(d, SUMMARY_FILE))).items() if k not in SUMMARY_IGNORED}
              for d in (dir_a, dir_b))
    for s in (sa, sb):
        s["warnings"] = sorted(s.get("warnings") or [])
    # JSON text compares NaN equal to NaN (a diverged loss), which == on floats does not.
    keys = [k for k in sorted(set(sa) | set(sb))
            if json.dumps(sa.get(k, "<missing>"), sort_keys=True) != json.dumps(sb.get(k, "<missing>"), sort_keys=True)]
    for k in keys:
        diffs.append(f"{SUMMARY_FILE}: {k!r}: re-ingest {json.dumps(sa.get(k, '<missing>'))[:200]}, "
                     f"full {json.dumps(sb.get(k, '<missing>'))[:200]}")
    return diffs


def count_files(run_dir: str) -> int:
    return sum(n.endswith(".parquet") for d, _, names in os.walk(run_dir) if INGESTED_DIR not in d for n in names)


def restore(src: str, ingested: str) -> None:
    shutil.rmtree(ingested, ignore_errors=True)
    shutil.copytree(src, ingested)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="64x100000",
                    help="RANKSxSTEPS,... written before the append (default 64x100000)")
    ap.add_argument("--append-steps", type=int, default=1000, help="steps appended to every rank (default 1000)")
    ap.add_argument("--steps-per-part", type=int, default=100,
                    help="steps per part file (default 100, the recorder's flush_every_steps)")
    ap.add_argument("--log-rows", choices=("same-part", "next-part"), default="same-part",
                    help="where the eval log row of step S goes: the part that ends S (bench_ingest.py's layout, "
                         "default) or the start of the next part (what a real Recorder writes when the log "
                         "follows the flush; with STEPS a multiple of 1000 the first appended part then carries "
                         "a log row for a step the first ingest already wrote)")
    ap.add_argument("--merge", action="store_true",
                    help="merge every rank's parts as they are written, as the recorder's writer thread does")
    ap.add_argument("--dir", default=None, help="where to write runs (default: a temp dir, deleted after)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run both re-ingests N times, interleaved; report the median wall and the largest "
                         "peak (default 1)")
    args = ap.parse_args()
    if args.append_steps < 1 or args.steps_per_part < 1:
        ap.error("--append-steps and --steps-per-part must be >= 1")
    base = args.dir or tempfile.mkdtemp(prefix="kforge-bench-watch-")
    os.makedirs(base, exist_ok=True)
    header = ("case", "files", "pipeline", "wall s", "peak GiB", "full/incr")
    widths = (18, 16, 18, 8, 9, 14)
    table, failed = [], False

    def row(*cells):
        table.append(cells)
        print(" ".join(f"{c:>{w}}" for c, w in zip(cells, widths)), flush=True)

    print(" ".join(f"{c:>{w}}" for c, w in zip(header, widths)))
    try:
        for size in args.sizes.split(","):
            ranks, steps = map(int, size.lower().split("x"))
            case = f"{ranks}x{steps}+{args.append_steps}"
            run = os.path.join(base, f"run-{ranks}x{steps}")
            saved, check_a = run + ".ingested-before-append", run + ".ingested-watch"
            for p in (run, saved, check_a):
                if os.path.exists(p):
                    sys.exit(f"{p} already exists: remove it or pick another --dir")
            ingested = os.path.join(run, INGESTED_DIR)
            total = steps + args.append_steps

            t0 = time.perf_counter()
            nxt = args.log_rows == "next-part"
            mergers = {} if args.merge else None
            rows, _ = write_steps(run, ranks, 1, steps + 1, args.steps_per_part, nxt, mergers)
            files = count_files(run)
            print(f"# {case}: wrote {rows:,} rows in {files:,} part files in {time.perf_counter() - t0:.1f}s",
                  file=sys.stderr, flush=True)
            wall, mem, out = measure(INCREMENTAL, run)
            check_ingest(out, steps)
            row(case, f"{files:,}", "first ingest", f"{wall:.2f}", f"{mem:.2f}", "")
            shutil.copytree(ingested, saved)

            t0 = time.perf_counter()
            new_rows, new_flushes = write_steps(run, ranks, steps + 1, total + 1, args.steps_per_part, nxt, mergers)
            new_files = count_files(run) - files
            print(f"# {case}: appended {new_rows:,} rows in {new_flushes:,} part files in "
                  f"{time.perf_counter() - t0:.1f}s", file=sys.stderr, flush=True)

            got = {"a": [], "b": []}
            for i in range(max(1, args.repeat)):
                t0 = time.perf_counter()
                restore(saved, ingested)
                print(f"# restored {INGESTED_DIR}/ in {time.perf_counter() - t0:.1f}s", file=sys.stderr, flush=True)
                wall, mem, out = measure(INCREMENTAL, run)
                appended = check_ingest(out, total)
                got["a"].append((wall, mem))
                if i == 0:
                    how = {"True": "yes", "False": "NO, it ingested from scratch"}.get(appended, "n/a")
                    print(f"# {case}: re-ingest appended to the last outputs (IngestResult.appended): {how}",
                          flush=True)
                    os.makedirs(check_a)
                    for name in OUTPUTS:
                        shutil.copy2(os.path.join(ingested, name), check_a)
                shutil.rmtree(ingested)
                wall, mem, out = measure(FULL, run)
                check_ingest(out, total)
                got["b"].append((wall, mem))
                if i == 0:
                    diffs = compare(check_a, ingested)
                    print(f"# {case}: outputs identical: {'yes' if not diffs else 'NO'}", flush=True)
                    for d in diffs:
                        print(f"#   {d}", flush=True)
                    failed |= bool(diffs)
            (a_wall, a_mem), (b_wall, b_mem) = (
                (statistics.median(w for w, _ in r), max(m for _, m in r)) for r in got.values())
            files_now = f"{files + new_files:,} ({new_files:+,})"
            row(case, files_now, "re-ingest (watch)", f"{a_wall:.2f}", f"{a_mem:.2f}", f"{b_wall / a_wall:.2f}x faster")
            row(case, files_now, "full re-ingest", f"{b_wall:.2f}", f"{b_mem:.2f}", "")
            for p in (run, saved, check_a):
                shutil.rmtree(p)
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)
    print(f"\n| {' | '.join(header)} |\n|{'|'.join(':---' if i < 3 else '---:' for i in range(len(header)))}|")
    for cells in table:
        print(f"| {' | '.join(cells)} |")
    if failed:
        sys.exit("outputs differ between re-ingest and full ingest (see above)")


if __name__ == "__main__":
    main()
