#!/usr/bin/env python
"""What each piece of ``end_step`` costs cold: an ablation, each piece alone added to a minimal body.

The minimal body reads the clock, appends the row tuple and checks the flush threshold; each
variant adds one piece of the real ``end_step`` (recorder.py) to it. Every call is followed by
``time.sleep(0.001)`` (untimed, the GIL released), as in bench_record_cold.py, with the same 11
fields; variants run in windows of 50 steps, in a new random order every round, and each figure
is the median over rounds of a window's median µs/step (start_step included).

    python benchmarks/bench_record_cold_parts.py             # ~1.5 min on 2 busy cores
    python benchmarks/bench_record_cold_parts.py --rounds 10 # smoke run
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import shutil
import statistics
import sys
import tempfile
import textwrap
import time
from time import perf_counter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_record import POOL, Recorder, make_pool  # noqa: E402

from kforge_record.convert import capture  # noqa: E402

WINDOW = 50
PIECES = {
    "lock (with self._lock: around the body)": None,
    "step check": """
        if step.__class__ is not int or not 0 <= step < 1 << 30:
            step = self._checked_step(step, "end_step")
    """,
    "4 named values' capture checks": """
        if loss.__class__ is not float and loss is not None:
            loss = capture(loss)
        if grad_norm.__class__ is not float and grad_norm is not None:
            grad_norm = capture(grad_norm)
        if lr.__class__ is not float and lr is not None:
            lr = capture(lr)
        if tokens.__class__ is not int and tokens is not None:
            tokens = capture(tokens)
    """,
    "scalars: names and capture checks": """
        if scalars:
            if not self._names_ok.issuperset(scalars):
                scalars = self._checked_names(scalars)
            for v in scalars.values():
                if v.__class__ is not float and v is not None:
                    break
    """,
    "pending phases check": """
        phases = self._pending
        if phases:
            phases = None
    """,
    "memory-sample countdown": """
        left = self._mem_left - 1
        if left:
            self._mem_left = left
    """,
    "time.time()": """
        w = time.time()
    """,
    "heartbeat's two stores": """
        self._hb_step[1] = step
        self._hb_time[2] = t
    """,
}
TAIL = """
    self._rows.append((step, t, t - self._t_step, loss, grad_norm, lr, tokens, None, None, None, scalars, None))
    self._t_step = t
    if len(self._rows) >= self._flush_every_steps:
        self._handoff(t)
"""


def variant(piece: str | None, lock: bool = False) -> type:
    body = "t = perf_counter()\n" + textwrap.dedent(piece or "") + textwrap.dedent(TAIL)
    if lock:
        body = "with self._lock:\n" + textwrap.indent(body, "    ")
    src = ("def end_step(self, /, step, loss=None, grad_norm=None, lr=None, tokens=None, **scalars):\n"
           + textwrap.indent(body, "    "))
    ns: dict = {}
    exec(src, {"perf_counter": perf_counter, "capture": capture, "time": time}, ns)  # noqa: S102
    return type("Variant", (Recorder,), {"end_step": ns["end_step"]})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=40)
    args = ap.parse_args()
    pool = make_pool(False)
    tmp = tempfile.mkdtemp(prefix="kforge-bench-parts-")
    classes = {"minimal body": variant(None), "the real end_step": Recorder}
    classes.update({f"+ {name}": variant(src, lock=src is None) for name, src in PIECES.items()})
    recs = {name: cls(os.path.join(tmp, str(i), "run"), install_sigterm_handler=False)
            for i, (name, cls) in enumerate(classes.items())}
    got: dict[str, list[float]] = {name: [] for name in recs}
    order, step = list(recs), 0
    try:
        for r in range(args.rounds):
            random.Random(r).shuffle(order)
            for name in order:
                rec, out = recs[name], []
                for _ in range(WINDOW):
                    step += 1
                    m = pool[step & (POOL - 1)]
                    t0 = perf_counter()
                    rec.start_step()
                    rec.end_step(step, **m)
                    out.append(perf_counter() - t0)
                    time.sleep(0.001)
                got[name].append(statistics.median(out) * 1e6)
            gc.collect()
        for rec in recs.values():
            rec.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    base = statistics.median(got["minimal body"])
    print(f"# {args.rounds} rounds of {WINDOW} steps per variant; load average {os.getloadavg()[0]:.2f}")
    print("| end_step body | median µs/step | over the minimal body |")
    print("|---|---:|---:|")
    for name, v in got.items():
        print(f"| {name} | {statistics.median(v):.2f} | {statistics.median(v) - base:+.2f} |")


if __name__ == "__main__":
    main()
