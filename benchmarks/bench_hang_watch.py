#!/usr/bin/env python
"""What the hang watch (kforge_record/hang.py) costs off the loop: one look (``HangWatch.check``, once
a second) and one re-arm of faulthandler's timer (``dump_traceback_later``: cancels the last and
starts a C thread; at most once a second, only when its deadline comes within 3 s).

    python benchmarks/bench_hang_watch.py

Prints the median and 90th percentile of each, in µs, over interleaved repeats. The loop's own cost
(none: end_step is unchanged) is measured by bench_record_ab.py.
"""

from __future__ import annotations

import faulthandler
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from kforge_record import Recorder  # noqa: E402

REPEATS = 2000


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        rec = Recorder(os.path.join(d, "run"), rank=0, world_size=1, hw_every_s=0, hang_after_s=300)
        rec.end_step(1, loss=1.0)
        f = open(os.path.join(d, "stacks.txt"), "w")  # noqa: SIM115
        look, arm = [], []
        for _ in range(REPEATS):
            t = time.perf_counter()
            rec._hang.check(time.monotonic())
            look.append(time.perf_counter() - t)
            t = time.perf_counter()
            faulthandler.dump_traceback_later(300, repeat=False, file=f)
            arm.append(time.perf_counter() - t)
        faulthandler.cancel_dump_traceback_later()
        rec.close()
    print("| what | median µs | p90 µs |\n|---|---:|---:|")
    for name, xs in (("one look (check), once a second", look), ("faulthandler re-arm", arm)):
        xs = sorted(x * 1e6 for x in xs)
        print(f"| {name} | {statistics.median(xs):.1f} | {xs[int(0.9 * len(xs))]:.1f} |")


if __name__ == "__main__":
    main()
