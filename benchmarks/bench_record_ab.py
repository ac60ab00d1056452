#!/usr/bin/env python
"""The recorder's hot path, this tree against an earlier commit, in one process, interleaved.

    python benchmarks/bench_record_ab.py                    # against 86c3947, the release before issue 11
    python benchmarks/bench_record_ab.py --ref HEAD~3 --windows 600
    python benchmarks/bench_record_ab.py --ref main --hw-every-s 0.05   # B samples a stand-in NVML (GPU telemetry) 20x/s
    taskset -c 1 python benchmarks/bench_record_ab.py       # one core: steadier on a shared machine

The earlier commit's ``kforge_record`` is taken with ``git archive`` into a temporary folder
under another package name (its imports are relative), so both recorders live in one process.
Each round times one window of 100 calls per side and case, in a new random order, and waits
(untimed) after each window for that recorder's writer (``rec.flush()``), as real steps of
milliseconds let it: so a noisy neighbour hits both sides alike, and figures are the 10th
percentile and the median of the per-window µs/call (the first tenth of the windows is warm-up).
The same 11 fields as bench_record.py (floats):

  end_step     rec.end_step(step, **fields), flush_every_steps=100
  ... tensors  the same, loss, grad_norm and the 3 user scalars as 0-dim CPU tensors (bench_record.py's)
  phases       start_step + 3 ``with rec.phase(...)`` + end_step (7 fields: the 3 timers are the
               recorder's own)
  log          rec.log(step, loss=..., lr=..., **3 scalars), as a framework's logging hook
"""

from __future__ import annotations

import argparse
import functools
import importlib
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from time import perf_counter

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WINDOW = 100
CASES = ("end_step", "end_step tensors", "phases", "log")
PACKAGE = "kforge_record_ab_ref"
TENSORS = ("loss", "grad_norm", "moe/aux_loss", "moe/load_imbalance", "train/ppl")  # 0-dim CPU tensors, as in a loop


def _pool() -> list[dict]:
    rng = random.Random(0)
    return [{
        "loss": rng.uniform(1.5, 3.0), "grad_norm": rng.uniform(0.2, 2.0), "lr": rng.uniform(1e-5, 3e-4),
        "tokens": rng.randrange(3000, 4097), "time/data_s": rng.uniform(0.001, 0.01),
        "time/fwd_bwd_s": rng.uniform(0.2, 0.3), "time/optimizer_s": rng.uniform(0.01, 0.03),
        "moe/aux_loss": rng.uniform(0.0, 0.05), "moe/load_imbalance": rng.uniform(1.0, 1.5),
        "train/ppl": rng.uniform(5.0, 20.0),
    } for _ in range(1024)]


def _end_step(rec, pool, first):
    end_step = rec.end_step
    t0 = perf_counter()
    for step in range(first, first + WINDOW):
        end_step(step, **pool[step & 1023])
    return perf_counter() - t0


def _phases(rec, pool, first):
    t0 = perf_counter()
    for step in range(first, first + WINDOW):
        rec.start_step()
        with rec.phase("data"):
            pass
        with rec.phase("fwd_bwd"):
            pass
        with rec.phase("optimizer"):
            pass
        rec.end_step(step, **pool[step & 1023])
    return perf_counter() - t0


def _log(rec, pool, first):
    log = rec.log
    t0 = perf_counter()
    for step in range(first, first + WINDOW):
        m = pool[step & 1023]
        log(step, loss=m["loss"], lr=m["lr"], **{"eval/loss": m["loss"], "eval/ppl": m["train/ppl"], "eval/acc": m["grad_norm"]})
    return perf_counter() - t0


def _fake_gpu() -> None:
    """Side B's process looks as if it used CUDA device 0, and NVML answers from Python (a real
    NVML call is a C call that releases the GIL: this stand-in holds it longer than NVML would)."""
    import types

    import kforge_record.env as env

    env.cuda_in_use = lambda: True
    env.device_info = lambda: {"type": "cuda", "index": 0, "name": "stand-in", "total_memory_bytes": 1}
    m = types.ModuleType("pynvml")
    m.NVML_TEMPERATURE_GPU, m.NVML_CLOCK_SM = 0, 1
    m.nvmlInit = lambda: None
    m.nvmlDeviceGetHandleByIndex = m.nvmlDeviceGetHandleByUUID = lambda i: i
    m.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=97, memory=40)
    m.nvmlDeviceGetTemperature = lambda h, s: 70
    m.nvmlDeviceGetPowerUsage = lambda h: 600_000
    m.nvmlDeviceGetClockInfo = lambda h, k: 1980
    m.nvmlDeviceGetCurrentClocksEventReasons = lambda h: 4
    sys.modules["pynvml"] = m


def extract_ref(ref: str, root: str) -> None:
    """``ref``'s kforge_record as package ``kforge_record_ab_ref`` under ``root`` (put ``root`` on sys.path)."""
    archive = subprocess.run(["git", "-C", HERE, "archive", ref, "kforge_record"], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", root], input=archive.stdout, check=True)
    os.rename(os.path.join(root, "kforge_record"), os.path.join(root, PACKAGE))


def _recorders(ref_root: str, tmp: str, hw_every_s: float | None) -> dict:
    """{(side, case): Recorder}: side A from the earlier commit, side B from this tree."""
    sys.path.insert(0, ref_root)
    sys.path.insert(0, HERE)
    import torch  # noqa: F401  (a training process has it; the recorder looks for it)

    from kforge_record import Recorder as B

    if hw_every_s is not None:
        _fake_gpu()
        B = functools.partial(B, hw_every_s=hw_every_s, memory_every_steps=0)

    A = importlib.import_module(PACKAGE).Recorder
    assert A.__module__.startswith(PACKAGE) and getattr(B, "func", B).__module__.startswith("kforge_record.")
    return {(side, case): cls(tempfile.mkdtemp(dir=tmp), flush_every_steps=WINDOW, flush_every_s=1e9,
                              install_sigterm_handler=False)
            for side, cls in (("A", A), ("B", B)) for case in CASES}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ref", default="86c3947", help="the commit to compare with (side A); side B is this tree")
    ap.add_argument("--windows", type=int, default=400, help="timed windows of 100 calls per side and case")
    ap.add_argument("--hw-every-s", type=float, default=None,
                    help="side B samples a stand-in NVML this often (GPU telemetry, on its own thread)")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="kforge-ab-")
    try:
        extract_ref(args.ref, tmp)
        recs = _recorders(tmp, tmp, args.hw_every_s)
        pools = {"end_step": _pool(), "log": _pool()}
        import torch

        pools["end_step tensors"] = [{k: torch.tensor(v) if k in TENSORS else v for k, v in m.items()} for m in pools["end_step"]]
        pools["phases"] = [{k: v for k, v in m.items() if not k.startswith("time/")} for m in pools["end_step"]]
        runs = {"end_step": _end_step, "end_step tensors": _end_step, "phases": _phases, "log": _log}
        print(f"# A = {args.ref}, B = this tree; {args.windows} windows of {WINDOW} calls per side and case, interleaved; "
              f"load average {os.getloadavg()[0]:.2f}, CPUs allowed {len(os.sched_getaffinity(0))}", flush=True)
        t_start = time.time()
        got = {k: [] for k in recs}
        order, rng = list(recs), random.Random(0)
        for w in range(args.windows):
            # Shuffled, not alternated: in A..B then B..A order the first and last keys always came
            # after a window of their own kind (warm), and identical code read up to 1.06x.
            rng.shuffle(order)
            for key in order:
                got[key].append(runs[key[1]](recs[key], pools[key[1]], 1 + w * WINDOW) / WINDOW * 1e6)
                recs[key].flush()  # untimed: the writer catches up, as between real steps
        hw_samples = sum(getattr(getattr(rec, "_writer", None), "_hw", None).samples for (side, _), rec in recs.items()
                         if side == "B" and hasattr(getattr(rec, "_writer", None), "_hw"))
        for rec in recs.values():
            rec.close()
            if rec.dropped_rows:
                raise SystemExit(f"{rec.dropped_rows} rows dropped")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print()
    print(f"| case | A {args.ref} p10 / median µs/call | B this tree p10 / median µs/call | B / A p10 | B / A median |")
    print("|---|---:|---:|---:|---:|")
    for case in CASES:
        a, b = (sorted(got[(side, case)][args.windows // 10:]) for side in "AB")
        pa, pb = a[len(a) // 10], b[len(b) // 10]
        ma, mb = statistics.median(a), statistics.median(b)
        print(f"| {case} | {pa:.2f} / {ma:.2f} | {pb:.2f} / {mb:.2f} | {pb / pa:.2f} | {mb / ma:.2f} |")
    print(f"\n# {time.time() - t_start:.0f} s, load average now {os.getloadavg()[0]:.2f}; "
          f"GPU telemetry samples taken by B's writers: {hw_samples}")


if __name__ == "__main__":
    main()
