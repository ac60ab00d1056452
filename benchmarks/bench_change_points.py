#!/usr/bin/env python
"""slow_episode's change points (findings/episodes.py, PELT in numpy) next to the ruptures library's.

The question this answers: is a maintained library better here? Each contender finds the change
points of the same log step-time series (a 1.5x episode in 3% noise), interleaved, median of the
repeats; ruptures' pure-Python PELT only up to 2,000 points (it is quadratic in Python calls). Also
ruptures' import time in a fresh interpreter (it imports scipy), paid by every ingest.

    python benchmarks/bench_change_points.py          # needs 'pip install ruptures' for its columns
"""

from __future__ import annotations

import math
import statistics
import subprocess
import sys
import time

import numpy as np

from kforge_dash.findings.episodes import PENALTY_BETA, change_points

REPEATS = 3


def series(n: int) -> np.ndarray:
    rng = np.random.default_rng(n)
    t = 0.1 * (1 + 0.03 * rng.standard_normal(n))
    t[3 * n // 10: 6 * n // 10] *= 1.5
    return t


def timed(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main() -> None:
    try:
        import ruptures as rpt
    except ImportError:
        rpt = None
    rows = []
    for n in (1_000, 2_000, 10_000, 100_000):
        t = series(n)
        x = np.log(t)
        pen = PENALTY_BETA * 0.03**2 * math.log(n)
        contenders = {"kforge PELT": lambda: change_points(t, 20)}
        if rpt is not None:
            contenders["ruptures KernelCPD (C)"] = lambda: rpt.KernelCPD(kernel="linear", min_size=20).fit(x).predict(pen=pen)[:-1]
            contenders["ruptures Binseg l2"] = lambda: rpt.Binseg(model="l2", min_size=20).fit(x).predict(pen=pen)[:-1]
            if n <= 2_000:
                contenders["ruptures Pelt l2"] = lambda: rpt.Pelt(model="l2", min_size=20).fit(x).predict(pen=pen)[:-1]
        times = {k: [] for k in contenders}
        found = {}
        for _ in range(REPEATS):
            for k, fn in contenders.items():
                if n > 10_000 and k == "ruptures Binseg l2" and times[k] and times[k][0] > 30:
                    continue
                dt, out = timed(fn)
                times[k].append(dt)
                found[k] = [int(c) for c in out]
        for k in contenders:
            rows.append((n, k, statistics.median(times[k]), found[k]))
    print(f"{'points':>8}  {'contender':<24} {'median s':>9}  change points")
    for n, k, s, cps in rows:
        print(f"{n:>8}  {k:<24} {s:>9.4f}  {cps if len(cps) < 6 else str(cps[:5]) + '...'}")
    if rpt is not None:
        imp = [float(subprocess.run([sys.executable, "-c", "import time; t = time.perf_counter(); import ruptures; "
                                     "print(time.perf_counter() - t)"], capture_output=True, text=True).stdout)
               for _ in range(REPEATS)]
        print(f"import ruptures (fresh interpreter, median of {REPEATS}): {statistics.median(imp):.2f} s")


if __name__ == "__main__":
    main()
