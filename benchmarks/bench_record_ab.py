#!/usr/bin/env python
"""The recorder's hot path, this tree against an earlier commit: interleaved fresh processes.

    python benchmarks/bench_record_ab.py                    # against 86c3947, the release before issue 11
    python benchmarks/bench_record_ab.py --ref HEAD~3 --pairs 7 --steps 30000
    taskset -c 1 python benchmarks/bench_record_ab.py       # one core: steadier on a shared machine

Each pair runs one child process per side, in alternating order (A B, B A, ...), so that a noisy
neighbour hits both alike; every figure is the median over the pairs, and the ratio is B / A.
The earlier commit's ``kforge_record`` is taken with ``git archive`` into a temporary folder; the
child puts that folder (or this tree) first on ``sys.path``. Timed, per call, with the same 11
fields as bench_record.py (floats):

  end_step paced    rec.end_step(step, **fields), flush_every_steps=100; after each window of 100
                    the loop waits, untimed, for the writer (rec.flush()), as real steps let it
  end_step bare     the same call with no hand-over in the timed loop (flush_every_steps=10**9)
  phases paced      start_step + 3 ``with rec.phase(...)`` + end_step (7 fields: the 3 timers are
                    the recorder's own)
  log paced         rec.log(step, loss=..., lr=..., **3 scalars), as a framework's logging hook
"""

from __future__ import annotations

import argparse
import json
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
CASES = ("end_step paced", "end_step bare", "phases paced", "log paced")


def _pool() -> list[dict]:
    rng = random.Random(0)
    return [{
        "loss": rng.uniform(1.5, 3.0), "grad_norm": rng.uniform(0.2, 2.0), "lr": rng.uniform(1e-5, 3e-4),
        "tokens": rng.randrange(3000, 4097), "time/data_s": rng.uniform(0.001, 0.01),
        "time/fwd_bwd_s": rng.uniform(0.2, 0.3), "time/optimizer_s": rng.uniform(0.01, 0.03),
        "moe/aux_loss": rng.uniform(0.0, 0.05), "moe/load_imbalance": rng.uniform(1.0, 1.5),
        "train/ppl": rng.uniform(5.0, 20.0),
    } for _ in range(1024)]


def _recorder(tmp: str, flush_every_steps: int):
    from kforge_record import Recorder

    return Recorder(tempfile.mkdtemp(dir=tmp), flush_every_steps=flush_every_steps, flush_every_s=1e9,
                    install_sigterm_handler=False)


def _end_step(rec, pool, steps, paced):
    loop_s = 0.0
    end_step = rec.end_step
    for first in range(1, steps + 1, WINDOW):
        t0 = perf_counter()
        for step in range(first, first + WINDOW):
            end_step(step, **pool[step & 1023])
        loop_s += perf_counter() - t0
        if paced:
            rec.flush()
    return loop_s


def _phases(rec, pool, steps):
    pool = [{k: v for k, v in m.items() if not k.startswith("time/")} for m in pool]
    loop_s = 0.0
    for first in range(1, steps + 1, WINDOW):
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
        loop_s += perf_counter() - t0
        rec.flush()
    return loop_s


def _log(rec, pool, steps):
    loop_s = 0.0
    log = rec.log
    for first in range(1, steps + 1, WINDOW):
        t0 = perf_counter()
        for step in range(first, first + WINDOW):
            m = pool[step & 1023]
            log(step, loss=m["loss"], lr=m["lr"], **{"eval/loss": m["loss"], "eval/ppl": m["train/ppl"],
                                                     "eval/acc": m["grad_norm"]})
        loop_s += perf_counter() - t0
        rec.flush()
    return loop_s


def child(root: str, steps: int) -> None:
    sys.path.insert(0, root)
    import torch  # noqa: F401  (a training process has it; the recorder looks for it)

    import kforge_record

    assert os.path.dirname(os.path.dirname(os.path.abspath(kforge_record.__file__))) == os.path.abspath(root)
    pool = _pool()
    tmp = tempfile.mkdtemp(prefix="kforge-ab-")
    out = {}
    try:
        runs = [("end_step paced", WINDOW, lambda r: _end_step(r, pool, steps, True)),
                ("end_step bare", 10**9, lambda r: _end_step(r, pool, steps, False)),
                ("phases paced", WINDOW, lambda r: _phases(r, pool, steps)),
                ("log paced", WINDOW, lambda r: _log(r, pool, steps))]
        for case, every, fn in runs:
            rec = _recorder(tmp, every)
            fn(rec)  # warm-up: the same loop, untimed (first calls, pyarrow in the writer)
            rec.close()
            rec = _recorder(tmp, every)
            out[case] = fn(rec) / steps * 1e6
            rec.close()
            if rec.dropped_rows:
                raise SystemExit(f"{case}: {rec.dropped_rows} rows dropped")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(out), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ref", default="86c3947", help="the commit to compare with (side A); side B is this tree")
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--steps", type=int, default=30_000, help="timed calls per case and child (whole windows of 100)")
    ap.add_argument("--child", nargs=2, metavar=("ROOT", "STEPS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]))
        return
    steps = -(-args.steps // WINDOW) * WINDOW
    old = tempfile.mkdtemp(prefix="kforge-ab-ref-")
    try:
        archive = subprocess.run(["git", "-C", HERE, "archive", args.ref, "kforge_record"], check=True, capture_output=True)
        subprocess.run(["tar", "-x", "-C", old], input=archive.stdout, check=True)
        sides = {"A": old, "B": HERE}
        got = {"A": [], "B": []}
        env = {**os.environ, "PYTHONPATH": ""}
        print(f"# A = {args.ref}, B = this tree; {args.pairs} pairs x {steps:,} calls; "
              f"load average {os.getloadavg()[0]:.2f}, CPUs allowed {len(os.sched_getaffinity(0))}", flush=True)
        t0 = time.time()
        for p in range(args.pairs):
            for side in ("AB" if p % 2 == 0 else "BA"):
                r = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", sides[side], str(steps)],
                                   check=True, capture_output=True, text=True, env=env, cwd=tempfile.gettempdir())
                got[side].append(json.loads(r.stdout.strip().splitlines()[-1]))
    finally:
        shutil.rmtree(old, ignore_errors=True)
    print()
    print(f"| case | A {args.ref} µs/call | B this tree µs/call | B / A | B each pair |")
    print("|---|---:|---:|---:|---|")
    for case in CASES:
        a = statistics.median(x[case] for x in got["A"])
        b = statistics.median(x[case] for x in got["B"])
        pairs = " ".join(f"{x[case] / y[case]:.2f}" for x, y in zip(got["B"], got["A"]))
        print(f"| {case} | {a:.2f} | {b:.2f} | {b / a:.2f} | {pairs} |")
    print(f"\n# {time.time() - t0:.0f} s, load average now {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
