"""One window's per-step reductions (kforge_dash/ingest/rowpass/reduce.py reduce_steps) of this checkout and
another, alternated in one process (same data, same load), median CPU time of each.

    python benchmarks/bench_reduce.py --old /work/main                   # grid, missing, restart; 64 x 10k
    python benchmarks/bench_reduce.py --old /work/main --kinds grid --ranks 1024 --steps 1000
    python benchmarks/bench_reduce.py --old /work/main --kinds wide_step --ranks 4096 --steps 100000 --repeat 1
    python benchmarks/bench_reduce.py --old /work/main --kinds every10 --ranks 1024 --steps 24000 --repeat 1

Kinds: ``grid`` every rank the same steps (the usual window), ``missing`` rank 1 misses every 7th
step, ``restart`` a second attempt from the middle step (each rank's rows twice in the window),
``wide_step`` every rank at step 0 then rank 0 alone over the other steps (an elastic shrink),
``every10`` rank 0 every step, the others every 10th. Also prints each one's peak numpy memory
(tracemalloc, one more run each, not timed).
"""
import argparse
import importlib.util
import os
import time
import tracemalloc

import numpy as np
import polars as pl

from kforge_dash.ingest.rowpass.buffers import Buffers


def load(path, name):
    """The module at ``path`` (another checkout's reduce.py; the rest of kforge_dash is this one's)."""
    spec = importlib.util.spec_from_file_location(name, path)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m



def frame(kind: str, R: int, S: int) -> pl.DataFrame:
    rng = np.random.default_rng(0)
    rank, step = np.repeat(np.arange(R), S), np.tile(np.arange(S), R)
    if kind == "wide_step":
        rank, step = np.r_[np.arange(R), np.zeros(S - 1, np.int64)], np.r_[np.zeros(R, np.int64), np.arange(1, S)]
    elif kind == "every10":
        rank = np.r_[np.zeros(S, np.int64), np.repeat(np.arange(1, R), len(range(0, S, 10)))]
        step = np.r_[np.arange(S), np.tile(np.arange(0, S, 10), R - 1)]
    n = len(rank)
    df = pl.DataFrame({"step": step, "rank": rank, "attempt": np.zeros(n, np.int64), "time": 1.7e9 + step + rng.random(n),
                       "step_time_s": rng.integers(1, 5, n) / 4, "loss": rng.random(n), "grad_norm": rng.random(n),
                       "lr": np.full(n, 0.1), "tokens": np.full(n, 100), "mem_allocated_bytes": np.full(n, 1 << 30),
                       "mem_peak_bytes": np.full(n, 1 << 30), "mem_reserved_bytes": np.full(n, 1 << 30),
                       **{f"u{i}": rng.random(n) for i in range(6)}, "hw/throttle_reasons": np.full(n, 4.0)})
    if kind == "missing":
        df = df.filter(~((pl.col("rank") == 1) & (pl.col("step") % 7 == 0)))
    elif kind == "restart":
        later = df.filter(pl.col("step") >= S // 2).with_columns(pl.lit(1, pl.Int64).alias("attempt"))
        df = pl.concat([df.filter(pl.col("step") < S // 2), later])
    return df


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", required=True, help="the other checkout (e.g. /work/main)")
    ap.add_argument("--kinds", default="grid,missing,restart")
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--steps", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    old = load(os.path.join(args.old, "kforge_dash/ingest/rowpass/reduce.py"), "old_reduce")
    new = load(os.path.join(here, "kforge_dash/ingest/rowpass/reduce.py"), "new_reduce")
    for kind in args.kinds.split(","):
        df = frame(kind, args.ranks, args.steps)
        cols, bufs, ts = list(df.columns), {"old": Buffers(), "new": Buffers()}, {"old": [], "new": []}
        assert old.reduce_steps(df, cols, False, bufs["old"]).equals(new.reduce_steps(df, cols, False, bufs["new"]))
        for i in range(args.repeat):
            for k, m in (("old", old), ("new", new)) if i % 2 else (("new", new), ("old", old)):
                t = time.process_time()
                m.reduce_steps(df, cols, False, bufs[k])
                ts[k].append(time.process_time() - t)
        o, n = np.median(ts["old"]) * 1e3, np.median(ts["new"]) * 1e3
        peak = {}
        for k, m in (("old", old), ("new", new)):
            tracemalloc.start()
            m.reduce_steps(df, cols, False, Buffers())
            peak[k] = tracemalloc.get_traced_memory()[1] / 2**20
            tracemalloc.stop()
        print(f"{kind:8} {args.ranks}x{args.steps}: old {o:7.1f} ms  this {n:7.1f} ms  this/old {n / o:.2f}  "
              f"(median CPU of {args.repeat}; min {min(ts['old']) * 1e3:.1f} / {min(ts['new']) * 1e3:.1f}); "
              f"peak MiB old {peak['old']:.0f} this {peak['new']:.0f}  ({df.height} rows)")


if __name__ == "__main__":
    main()
