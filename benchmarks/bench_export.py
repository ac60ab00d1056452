#!/usr/bin/env python
"""Export cost, side by side on the same history (100k steps x 20 scalars by default):

  TensorBoard  kforge   load_history (Parquet -> polars) + write_tensorboard (one Event per step,
                        tensorboard's protos and RecordWriter, temp file + atomic replace)
               baseline torch.utils.tensorboard.SummaryWriter.add_scalar per value, from numpy arrays
                        already in memory, then close()
  W&B          kforge   load_history + write_wandb (offline run, temp dir swap, summary, counts)
               baseline a bare offline loop: wandb.init, run.log(dict, step=step) over dicts built
                        before the clock starts, run.finish()

Both sides of each pair include their open/close (init/finish); wandb's service is started once,
untimed, before the W&B pair, whose sides run interleaved (best of --wandb-repeats each). The
machine may be shared: read the ratios, not the absolute microseconds.

    python benchmarks/bench_export.py                          # the README table (a few minutes)
    python benchmarks/bench_export.py --steps 5000             # quick
    python benchmarks/bench_export.py --wandb-steps 20000      # fewer steps for the W&B pair
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from kforge_dash.export.history import load_history
from kforge_dash.export.tensorboard import write_tensorboard
from kforge_dash.export.wandb import write_wandb

# 20 scalars per step, every one present (the most a step can cost).
SCALARS = ("loss", "grad_norm", "lr", "tokens", "tokens_per_sec", "mfu", "step_time_s", "step_work_min_s",
           "step_work_median_s", "loss_ema", "tokens_per_sec_ema", "mfu_ema", "step_time_s_ema",
           "mem_allocated_bytes", "mem_peak_bytes", "mem_reserved_bytes", "time/data_s", "time/fwd_bwd_s",
           "time/optimizer_s", "eval/loss")


def make_run(root: str, name: str, steps: int) -> str:
    rng = np.random.default_rng(0)
    run = os.path.join(root, name)
    ing = os.path.join(run, "ingested")
    os.makedirs(ing)
    step = np.arange(1, steps + 1, dtype=np.int64)
    cols = {"step": step, "time": 1.79e9 + np.cumsum(rng.uniform(0.5, 0.6, steps))}
    for c in SCALARS:
        if c in ("tokens",) or c.startswith("mem_"):
            cols[c] = rng.integers(1, 80 * 2**30, steps, dtype=np.int64)
        else:
            cols[c] = rng.random(steps)
    pq.write_table(pa.table(cols), os.path.join(ing, "steps.parquet"))
    pq.write_table(pa.table({"step": step, "rank": np.zeros(steps, np.int64), "step_time_s": cols["step_time_s"]}),
                   os.path.join(ing, "ranks.parquet"))
    summary = {"schema_version": "1.0", "run_name": name, "world_size": 1, "ranks": [0], "hparams": {"lr": 3e-4},
               "model": {"flops_per_token": 6e9}, "device": {"name": "bench", "type": "cpu"}, "tags": [],
               "attempts": [{"attempt": 0, "attempt_ids": ["bench"]}], "exports": None}
    with open(os.path.join(ing, "summary.json"), "w") as f:
        json.dump(summary, f)
    return run


def bench_tb_kforge(run: str, *, fast_crc: bool) -> float:
    logdir = os.path.join(run, "ingested", "tensorboard")
    shutil.rmtree(logdir, ignore_errors=True)  # a first export: an existing file would be compared, not rewritten
    t0 = time.perf_counter()
    h = load_history(run, max_rank_tags=0)  # 20 scalars, no per-rank tags: the same values as the baseline
    write_tensorboard(h, logdir, fast_crc=fast_crc)
    return time.perf_counter() - t0


def bench_tb_summarywriter(run: str, logdir: str) -> float:
    from torch.utils.tensorboard import SummaryWriter

    t = pq.read_table(os.path.join(run, "ingested", "steps.parquet"))
    steps = t["step"].to_numpy().tolist()
    times = t["time"].to_numpy().tolist()
    cols = [(c, t[c].to_numpy().astype(float).tolist()) for c in SCALARS]
    t0 = time.perf_counter()
    w = SummaryWriter(logdir)
    add = w.add_scalar
    for i, (s, wt) in enumerate(zip(steps, times)):
        for c, v in cols:
            add(c, v[i], s, walltime=wt)
    w.close()
    return time.perf_counter() - t0


def bench_wandb_kforge(run: str) -> float:
    t0 = time.perf_counter()
    h = load_history(run, max_rank_tags=0)
    write_wandb(h, project="bench")
    return time.perf_counter() - t0


def _wandb_settings():
    import wandb

    return wandb.Settings(mode="offline", console="off", silent=True, x_disable_stats=True, x_disable_meta=True,
                          x_disable_machine_info=True, x_save_requirements=False, save_code=False, disable_git=True)


def warm_wandb(root: str) -> None:
    """Start wandb's service once, untimed, so neither side pays the first launch of wandb-core."""
    import wandb

    wandb.init(dir=root, project="bench", id="warm-up", settings=_wandb_settings(), reinit="create_new").finish()


def bench_wandb_bare(run: str, root: str) -> float:
    import wandb

    t = pq.read_table(os.path.join(run, "ingested", "steps.parquet"))
    steps = t["step"].to_numpy().tolist()
    cols = [(c, t[c].to_numpy().astype(float).tolist()) for c in SCALARS]
    rows = [{c: v[i] for c, v in cols} for i in range(len(steps))]
    settings = _wandb_settings()
    t0 = time.perf_counter()
    r = wandb.init(dir=root, project="bench", id="bare-loop", settings=settings, reinit="create_new")
    for s, row in zip(steps, rows):
        r.log(row, step=s)
    r.finish()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--wandb-steps", type=int, default=None, help="steps for the W&B pair (default: --steps)")
    ap.add_argument("--wandb-repeats", type=int, default=2, help="W&B runs per side (best is kept; it is noisy)")
    ap.add_argument("--skip-wandb", action="store_true")
    args = ap.parse_args()
    wsteps = args.wandb_steps or args.steps
    root = tempfile.mkdtemp(prefix="kforge-bench-export-")
    try:
        rows = []
        run = make_run(root, "tb", args.steps)
        b = bench_tb_summarywriter(run, os.path.join(root, "tb-summarywriter"))
        k = bench_tb_kforge(run, fast_crc=True)
        rows.append(("TensorBoard", args.steps, "SummaryWriter.add_scalar", b, k))
        k = bench_tb_kforge(run, fast_crc=False)
        rows.append(("TensorBoard, pure-Python CRC (no google-crc32c)", args.steps, "SummaryWriter.add_scalar", b, k))
        if not args.skip_wandb:
            wrun = make_run(root, "wb", wsteps)
            os.makedirs(os.path.join(root, "wb-bare"))
            warm_wandb(os.path.join(root, "wb-bare"))
            bs, ks = [], []
            for i in range(args.wandb_repeats):  # interleaved, alternating who goes first; best of each
                for side in (("bare", "kforge") if i % 2 == 0 else ("kforge", "bare")):
                    if side == "bare":
                        bs.append(bench_wandb_bare(wrun, os.path.join(root, "wb-bare")))
                    else:
                        ks.append(bench_wandb_kforge(wrun))
            b, k = min(bs), min(ks)
            rows.append(("W&B offline", wsteps, "bare run.log loop", b, k))
        print(f"\n{len(SCALARS)} scalars per step; µs per step (lower is better); ratio = baseline / kforge\n")
        print("| export | steps | baseline | baseline µs/step | kforge µs/step | kforge speed-up |")
        print("| --- | ---: | --- | ---: | ---: | ---: |")
        for name, n, base, b, k in rows:
            print(f"| {name} | {n:,} | {base} | {b / n * 1e6:,.1f} | {k / n * 1e6:,.1f} | {b / k:.2f}x |")
        print("\nGoals: TensorBoard speed-up >= 10x; W&B kforge/baseline <= 1.2 (speed-up >= 0.83x).")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
