#!/usr/bin/env python
"""The writer thread's CPU per flush, the Compactor given each flush's table (held until merged) or
not (the small parts read back from disk to merge them). Same code both ways, interleaved.

    python benchmarks/bench_compact.py                 # 100 and 1,000 rows a flush
    python benchmarks/bench_compact.py --rows 100 --flushes 2000 --repeats 9

A flush: the recorder's rows to an Arrow table (convert.rows_to_table), the part file written as
the writer writes it, then Compactor.part_written (which merges every 10th, 100th, 1,000th
flush). Prints the medians of the interleaved repeats (CPU time of this process: one thread).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pyarrow.parquet as pq  # noqa: E402

from kforge_record.compact import Compactor  # noqa: E402
from kforge_record.convert import rows_to_table  # noqa: E402
from kforge_record.schema import part_file_name  # noqa: E402
from kforge_record.warn import Warner  # noqa: E402

SCALARS = ("moe/aux_loss", "moe/load_imbalance", "train/ppl")
PHASES = ("time/data_s", "time/fwd_bwd_s", "time/optimizer_s")


def _rows(first: int, n: int) -> list[tuple]:
    """Rows as Recorder.end_step buffers them: 11 fields a step (3 of them phase timers)."""
    return [(s, 1.7e9 + s, 0.25, 2.0 + s % 7 * 0.01, 0.5, 3e-4, 4096, None, None, None,
             {k: 0.1 * (s % 5) for k in SCALARS}, [(p, 0.01) for p in PHASES]) for s in range(first, first + n)]


def _run(rows_per_flush: int, flushes: int, held: bool, warn: Warner) -> float:
    """Writer CPU ms per flush."""
    d = tempfile.mkdtemp(prefix="kforge-bench-compact-")
    try:
        comp = Compactor(d, warn)
        batches = [_rows(i * rows_per_flush, rows_per_flush) for i in range(flushes)]
        t0 = time.process_time()
        for i, rows in enumerate(batches):
            table = rows_to_table(rows, warn)
            pq.write_table(table, os.path.join(d, part_file_name(i)), compression="zstd", use_dictionary=False)
            comp.part_written(i, table.num_rows, table if held else None)
        return (time.process_time() - t0) / flushes * 1e3
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[100, 1000], help="rows a flush")
    ap.add_argument("--flushes", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    warn = Warner("bench")
    print("| rows a flush | held: writer CPU ms/flush | read back: writer CPU ms/flush | held / read back |")
    print("|---:|---:|---:|---:|")
    for n in args.rows:
        got = {True: [], False: []}
        _run(n, 50, True, warn)  # warm-up
        for r in range(args.repeats):
            for held in ((True, False) if r % 2 else (False, True)):
                got[held].append(_run(n, args.flushes, held, warn))
        a, b = statistics.median(got[True]), statistics.median(got[False])
        print(f"| {n:,} | {a:.3f} | {b:.3f} | {a / b:.2f} |")
    print(f"\n# medians of {args.repeats} interleaved repeats; load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
