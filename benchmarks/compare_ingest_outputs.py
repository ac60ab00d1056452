"""Do two checkouts of kforge ingest a run to the same outputs? For changes meant to be speed only.

    python benchmarks/compare_ingest_outputs.py --old /work/main --new . sample_runs/*
    python benchmarks/compare_ingest_outputs.py --old /work/main --new . /tmp/bench-run --chunk-rows 300

Each run is copied twice (without ingested/), ingested from scratch by each checkout in its own
interpreter (PYTHONPATH=CHECKOUT), and compared: steps.parquet byte for byte, ranks.parquet the
same rows in the same order with the same column types and row-group step/rank/attempt
statistics, summary.json equal but for ``ingested_at``. Prints one line per run; exits 1 on a
difference.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

INGEST = """
import sys
from kforge_dash.ingest.options import IngestOptions
from kforge_dash.ingest.run import ingest_run
ingest_run(sys.argv[1], options=IngestOptions(force=True, chunk_rows=int(sys.argv[2])))
"""
_TIMINGS = {"ingested_at"}


def _ingest(tree: str, run: str, chunk_rows: int) -> None:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
    subprocess.run([sys.executable, "-W", "ignore", "-c", INGEST, run, str(chunk_rows)], env=env, check=True,
                   cwd=tempfile.gettempdir())


def _key_stats(path: str) -> list:
    import pyarrow.parquet as pq

    md = pq.read_metadata(path)
    names = md.schema.names
    out = []
    for g in range(md.num_row_groups):
        rg = md.row_group(g)
        for c in ("step", "rank", "attempt"):
            s = rg.column(names.index(c)).statistics
            out.append((g, c, rg.num_rows, s.min if s is not None and s.has_min_max else None,
                        s.max if s is not None and s.has_min_max else None))
    return out


def differences(a: str, b: str) -> list[str]:
    """What differs between two ingested/ folders (empty: the same)."""
    import polars as pl

    diffs = []
    with open(os.path.join(a, "steps.parquet"), "rb") as fa, open(os.path.join(b, "steps.parquet"), "rb") as fb:
        if fa.read() != fb.read():
            diffs.append("steps.parquet bytes differ")
    ra, rb = pl.read_parquet(os.path.join(a, "ranks.parquet")), pl.read_parquet(os.path.join(b, "ranks.parquet"))
    if ra.schema != rb.schema:
        diffs.append(f"ranks.parquet schema {ra.schema} != {rb.schema}")
    elif not ra.equals(rb, null_equal=True):
        diffs.append("ranks.parquet rows differ (or their order)")
    if _key_stats(os.path.join(a, "ranks.parquet")) != _key_stats(os.path.join(b, "ranks.parquet")):
        diffs.append("ranks.parquet row groups or their step/rank/attempt statistics differ")
    sa, sb = (json.load(open(os.path.join(d, "summary.json"))) for d in (a, b))
    for k in sorted(set(sa) | set(sb) - _TIMINGS):
        if k not in _TIMINGS and sa.get(k) != sb.get(k):
            diffs.append(f"summary[{k!r}] differs")
    return diffs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--old", required=True, help="checkout to compare against (e.g. /work/main)")
    ap.add_argument("--new", default=".", help="checkout under test (default: here)")
    ap.add_argument("--chunk-rows", type=int, default=1_000_000, help="rows a window (small: many windows)")
    args = ap.parse_args()
    bad = 0
    with tempfile.TemporaryDirectory(prefix="kforge-compare-") as tmp:
        for i, run in enumerate(r for r in args.runs if os.path.isdir(r)):
            outs = []
            for side, tree in (("old", args.old), ("new", args.new)):
                dst = os.path.join(tmp, f"{i}-{side}", os.path.basename(os.path.normpath(run)))
                shutil.copytree(run, dst, ignore=shutil.ignore_patterns("ingested"), symlinks=True)
                _ingest(tree, dst, args.chunk_rows)
                outs.append(os.path.join(dst, "ingested"))
            diffs = differences(*outs)
            bad += bool(diffs)
            print(f"{run}: {'same' if not diffs else '; '.join(diffs)}", flush=True)
            for d in outs:
                shutil.rmtree(os.path.dirname(d))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
