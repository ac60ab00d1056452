#!/usr/bin/env python
"""What the KempnerForge drop-in costs per step, and what its log steps (KempnerForge's StepMetrics
and printed line) add, next to the plain Recorder.

  recorder    Recorder.start_step + end_step (the floor)
  no-kf       the drop-in with KempnerForge not importable: end_step returns None on every step
  kf li=10    the drop-in with KempnerForge's stand-in (tests/standins), log_interval 10 (7b.toml's)
  kf li=1     the same, log_interval 1 (every step a log step: 70b_32gpu_tp4.toml and others)

Flushes are pushed past the timed steps (flush_every_steps/_s) and memory sampling is off, so the
figure is the loop-side host time only. The printed lines go to a discarded stream.

    python benchmarks/bench_kempnerforge.py            # ~1 min
    python benchmarks/bench_kempnerforge.py --quick

Contenders run interleaved within each repeat (rotating order); every figure is a median over them.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
import statistics
import sys
import tempfile
import warnings
from pathlib import Path
from time import perf_counter

import torch

STANDINS = Path(__file__).resolve().parent.parent / "tests" / "standins"
QUIET = dict(install_sigterm_handler=False, flush_every_steps=10**6, flush_every_s=1e9, max_backlog_rows=10**6,
             memory_every_steps=0)


def _tracker(run_dir: str, log_interval: int | None):
    from kforge_record import Recorder
    from kforge_record.integrations.kempnerforge import MetricsTracker

    if log_interval is None:
        return Recorder(run_dir, **QUIET)
    if log_interval == 0:  # KempnerForge not importable
        sys.modules["kempnerforge"] = None
        try:
            return MetricsTracker(None, run_dir=run_dir, **QUIET)
        finally:
            del sys.modules["kempnerforge"]
    sys.path.insert(0, str(STANDINS))
    from kempnerforge.config.schema import JobConfig, MetricsConfig

    return MetricsTracker(JobConfig(metrics=MetricsConfig(log_interval=log_interval)), run_dir=run_dir, **QUIET)


CONTENDERS = {"recorder": None, "no-kf": 0, "kf li=10": 10, "kf li=1": 1}


def time_one(log_interval, steps: int) -> float:
    tmp = tempfile.mkdtemp(prefix="kforge-bench-kf-")
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            t = _tracker(os.path.join(tmp, "kf"), log_interval)
            loss, grad_norm = torch.tensor(2.5), torch.tensor(0.8)
            for i in range(1, 51):  # warm up
                t.start_step()
                t.end_step(i, loss, grad_norm, 3e-4, 4096)
            t0 = perf_counter()
            for i in range(51, 51 + steps):
                t.start_step()
                t.end_step(i, loss, grad_norm, 3e-4, 4096)
            dt = perf_counter() - t0
            t.close()
        return dt / steps * 1e6
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=5000)
    p.add_argument("--repeat", type=int, default=9)
    p.add_argument("--quick", action="store_true")
    a = p.parse_args()
    steps, repeat = (500, 2) if a.quick else (a.steps, a.repeat)
    warnings.simplefilter("ignore")  # the no-kf contender's "cannot import KempnerForge" warning
    names, got = list(CONTENDERS), {k: [] for k in CONTENDERS}
    for i in range(repeat):
        for k in names[i % len(names):] + names[:i % len(names)]:
            got[k].append(time_one(CONTENDERS[k], steps))
    med = {k: statistics.median(v) for k, v in got.items()}
    print(f"{steps} steps x {repeat} repeats, medians, µs per step (host time of start_step + end_step)\n")
    print("| contender | µs/step | vs recorder | vs no-kf |")
    print("| --- | ---: | ---: | ---: |")
    for k in names:
        print(f"| {k} | {med[k]:.2f} | {med[k] / med['recorder']:.2f} | {med[k] / med['no-kf']:.2f} |")


if __name__ == "__main__":
    main()
