#!/usr/bin/env python
"""What logging one step costs *cold*: each call ≥ 1 ms after the last, the GIL released between.

bench_record.py times `end_step` back to back between flushes: caches, branch predictors and the
interpreter's specialisations stay warm, which a training loop never gives them. Here every timed
call is followed by a wait (untimed) that releases the GIL, as torch's kernels and a GPU queue do:
`time.sleep(WAIT_S)` by default. Per step, with the same 11 fields as bench_record.py (its FIELDS
and value pool, imported, not copied):

  floor     rows.append({"step": step, **metrics})
  kforge    rec.start_step(); 3 × `with rec.phase(...)`; rec.end_step(step, **metrics)
            (the 3 phase timers are the recorder's own, so 7 values + step go to end_step)
  kforge 11 rec.start_step(); rec.end_step(step, **metrics)   (the 11 fields, no phase timers)
  wandb     run.log(metrics, step=step)                     offline, console off, no stats
  tensorb.  writer.add_scalar(name, value, step) × 10       torch.utils.tensorboard.SummaryWriter

    python benchmarks/bench_record_cold.py           # ~1.5 min on 2 busy cores
    python benchmarks/bench_record_cold.py --quick   # smoke run, ~15 s
    python benchmarks/bench_record_cold.py --ref main   # A/B: this tree's recorder against main's, ~2 min

With ``--ref`` the contenders are the two kforge cases for this tree and for REF (its
kforge_record taken with ``git archive``, as bench_record_ab.py does), beside three floors (the
dict, an empty function called with the fields, ``start_step`` + an ``end_step`` with an empty
body): no wandb or TensorBoard, 100 steps each per repeat (one flush), 60 repeats, in a new
random order every repeat.

Contenders run one after another within a repeat, in an order that rotates every repeat; each
figure is the median over repeats of that repeat's mean (and median) µs per step.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from time import perf_counter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_record import (  # noqa: E402
    FIELDS,
    POOL,
    Recorder,
    _check_recorder,
    _new_recorder,
    make_pool,
    torch,
    wandb_offline_run,
)
from bench_record_ab import PACKAGE, extract_ref  # noqa: E402

WAIT_S = 0.001  # between two steps' logging calls: a (very short) training step


def cold_floor(pool, steps, tmp):
    rows, out = [], []
    for step in range(1, steps + 1):
        m = pool[step & (POOL - 1)]
        t0 = perf_counter()
        rows.append({"step": step, **m})
        out.append(perf_counter() - t0)
        time.sleep(WAIT_S)
    return out


def _empty(step, loss=None, grad_norm=None, lr=None, tokens=None, **scalars):
    pass


def cold_call(pool, steps, tmp):
    out = []
    for step in range(1, steps + 1):
        m = pool[step & (POOL - 1)]
        t0 = perf_counter()
        _empty(step, **m)
        out.append(perf_counter() - t0)
        time.sleep(WAIT_S)
    return out


class _EmptyEnd(Recorder):
    def end_step(self, /, step, loss=None, grad_norm=None, lr=None, tokens=None, **scalars):
        pass


def cold_kforge_empty(pool, steps, tmp):
    """start_step + an end_step with an empty body (its signature): what the API's call costs."""
    return cold_kforge_11(pool, steps, tmp, cls=_EmptyEnd, check=False)


def cold_kforge(pool, steps, tmp, cls=None):
    pool = [{k: v for k, v in m.items() if not k.startswith("time/")} for m in pool]
    d, rec = _new_recorder(tmp, cls=cls)
    out = []
    for step in range(1, steps + 1):
        m = pool[step & (POOL - 1)]
        t0 = perf_counter()
        rec.start_step()
        with rec.phase("data"):
            pass
        with rec.phase("fwd_bwd"):
            pass
        with rec.phase("optimizer"):
            pass
        rec.end_step(step, **m)
        out.append(perf_counter() - t0)
        time.sleep(WAIT_S)
    rec.close()
    _check_recorder(rec, steps)
    shutil.rmtree(d)
    return out


def cold_kforge_11(pool, steps, tmp, cls=None, check=True):
    d, rec = _new_recorder(tmp, cls=cls)
    out = []
    for step in range(1, steps + 1):
        m = pool[step & (POOL - 1)]
        t0 = perf_counter()
        rec.start_step()
        rec.end_step(step, **m)
        out.append(perf_counter() - t0)
        time.sleep(WAIT_S)
    rec.close()
    if check:  # (an empty end_step records nothing)
        _check_recorder(rec, steps)
    shutil.rmtree(d)
    return out


def cold_wandb(pool, steps, tmp):
    d = tempfile.mkdtemp(dir=tmp)
    run = wandb_offline_run(d)  # not timed
    out = []
    for step in range(1, steps + 1):
        m = pool[step & (POOL - 1)]
        t0 = perf_counter()
        run.log(m, step=step)
        out.append(perf_counter() - t0)
        time.sleep(WAIT_S)
    run.finish()
    shutil.rmtree(d, ignore_errors=True)
    return out


def cold_tensorboard(pool, steps, tmp):
    from torch.utils.tensorboard import SummaryWriter

    d = tempfile.mkdtemp(dir=tmp)
    writer = SummaryWriter(log_dir=d)
    out = []
    for step in range(1, steps + 1):
        m = pool[step & (POOL - 1)]
        t0 = perf_counter()
        for name, value in m.items():
            writer.add_scalar(name, value, step)
        out.append(perf_counter() - t0)
        time.sleep(WAIT_S)
    writer.close()
    shutil.rmtree(d, ignore_errors=True)
    return out


CONTENDERS = (
    ("floor: list.append(dict)", cold_floor),
    ("kforge start_step + 3 phase() + end_step", cold_kforge),
    (f"kforge start_step + end_step, {len(FIELDS) + 1} fields", cold_kforge_11),
    ("wandb offline run.log", cold_wandb),
    (f"SummaryWriter.add_scalar × {len(FIELDS)}", cold_tensorboard),
)


def ab_contenders(ref: str, tmp: str) -> tuple:
    """The floor, then both kforge cases for this tree and for ``ref`` (imported from ``tmp``)."""
    import functools
    import importlib

    extract_ref(ref, tmp)
    sys.path.insert(0, tmp)
    A = importlib.import_module(PACKAGE).Recorder
    out = [CONTENDERS[0], ("floor: an empty function called with the fields", cold_call),
           ("floor: start_step + an empty end_step", cold_kforge_empty)]
    for case, fn in (("start_step + 3 phase() + end_step", cold_kforge),
                     (f"start_step + end_step, {len(FIELDS) + 1} fields", cold_kforge_11)):
        out += [(f"kforge {case} (this tree)", fn), (f"kforge {case} ({ref})", functools.partial(fn, cls=A))]
    return tuple(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=2000, help="steps per contender per repeat")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="small counts: a smoke run")
    ap.add_argument("--ref", help="A/B: this tree's recorder against this commit's (no wandb, no TensorBoard)")
    args = ap.parse_args()
    if args.ref and "--steps" not in sys.argv and "--repeats" not in sys.argv:
        # Short windows, many of them: both sides see the same moments of a shared machine's load
        # (in windows of 500 steps, the load shifting between two of them read as ±10 %).
        args.steps, args.repeats = 100, 60
    if args.quick:
        args.steps, args.repeats = 200, 2
    t_start = perf_counter()
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    os.environ["WANDB_SILENT"] = "true"
    os.environ.setdefault("WANDB_MODE", "offline")

    import wandb

    print(f"# kforge_record cold-call benchmark  {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC")
    print(f"# {' '.join([os.path.basename(sys.executable)] + sys.argv)}")
    print(f"# python {platform.python_version()}, torch {torch.__version__}, wandb {wandb.__version__}, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")

    pool = make_pool(False)
    tmp = tempfile.mkdtemp(prefix="kforge-bench-cold-")
    contenders = ab_contenders(args.ref, tmp) if args.ref else CONTENDERS
    means = {label: [] for label, _ in contenders}
    medians = {label: [] for label, _ in contenders}
    try:
        for _, fn in contenders:  # warm-up, untimed: imports, pyarrow, wandb's service process
            fn(pool, 20, tmp)
        for r in range(args.repeats):
            k = r % len(contenders)
            order = list(contenders[k:] + contenders[:k])
            if args.ref:
                random.Random(r).shuffle(order)
            for label, fn in order:
                gc.collect()
                per_step = fn(pool, args.steps, tmp)
                means[label].append(statistics.fmean(per_step) * 1e6)
                medians[label].append(statistics.median(per_step) * 1e6)
            if not args.ref or r % 10 == 9:
                print(f"# repeat {r + 1}/{args.repeats} done", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    kforge = contenders[3 if args.ref else 1][0]
    k_mean, k_med = statistics.median(means[kforge]), statistics.median(medians[kforge])
    print()
    print(f"Per-step cost, cold: one step's logging every {WAIT_S * 1e3:g} ms (time.sleep between, untimed), "
          f"11 fields a step,\n{args.steps:,} steps per contender per repeat, median of {args.repeats} repeats")
    print()
    print("| contender | mean µs/step | × kforge | median µs/step | × kforge |")
    print("|---|---:|---:|---:|---:|")
    for label, _ in contenders:
        mean, med = statistics.median(means[label]), statistics.median(medians[label])
        print(f"| {label} | {mean:.2f} | {mean / k_mean:.2f} | {med:.2f} | {med / k_med:.2f} |")
    if args.ref:
        print()
        print(f"| case | this tree / {args.ref}, mean | median |")
        print("|---|---:|---:|")
        for (label, _), (ref_label, _) in zip(contenders[3::2], contenders[4::2]):
            b, a = (statistics.median(means[x]) for x in (label, ref_label))
            mb, ma = (statistics.median(medians[x]) for x in (label, ref_label))
            print(f"| {label.removesuffix(' (this tree)')} | {b / a:.2f} | {mb / ma:.2f} |")
    print()
    print("mean: all of a repeat's timed calls / steps (the recorder's flushes, wandb's and TensorBoard's queue\n"
          "handoffs included); median: the typical step. Warm figures, calls back to back: bench_record.py.")
    print(f"\n# whole run: {(perf_counter() - t_start) / 60:.1f} min")


if __name__ == "__main__":
    main()
