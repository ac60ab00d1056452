"""kforge-import's TensorBoard reader next to TensorBoard's EventAccumulator, on the same generated event file.

    PYTHONPATH=$PWD python3 benchmarks/bench_import.py                    # side by side, then a 1M-step estimate
    PYTHONPATH=$PWD python3 benchmarks/bench_import.py --big-steps 1000000  # measure the 1M x 15 log itself

Part 1: a log of --steps steps x --tags tags (one event per scalar, as SummaryWriter.add_scalar writes),
read by EventAccumulator (size_guidance 0: every point) and by kforge's reader
(kforge_dash.importers.tensorboard.read_run), --repeats interleaved repeats; medians and their ratio.
Part 2: the whole import (read, rows, shards written) of a --big-steps x --tags log, once, on one core,
scaled linearly to 1M steps when --big-steps is smaller (the reader is one pass: time is linear in events).
"""

from __future__ import annotations

import argparse
import os
import statistics
import struct
import sys
import tempfile
import time

import google_crc32c
from tensorboard.compat.proto import event_pb2

_MASK = 0xA282EAD8


def _masked(data: bytes) -> bytes:
    c = google_crc32c.value(data)
    return struct.pack("<I", ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + _MASK) & 0xFFFFFFFF)


def write_log(folder: str, steps: int, tags: int) -> str:
    """One event file: a file_version event, then per step one event per tag (as add_scalar writes)."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "events.out.tfevents.1700000000.bench.1.0")
    names = [f"group{t % 3}/metric{t}" for t in range(tags)]
    with open(path, "wb") as f:
        def put(ev):
            data = ev.SerializeToString()
            head = struct.pack("<Q", len(data))
            f.write(head + _masked(head) + data + _masked(data))
        put(event_pb2.Event(wall_time=1.7e9, step=0, file_version="brain.Event:2"))
        ev = event_pb2.Event()
        v = ev.summary.value.add()
        for s in range(steps):
            ev.step = s
            for t, name in enumerate(names):
                ev.wall_time = 1.7e9 + s * 0.1 + t * 1e-4
                v.tag = name
                v.simple_value = 1.0 / (1 + s + t)
                put(ev)
    return path


def read_ea(folder: str) -> int:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(folder, size_guidance={"scalars": 0})
    ea.Reload()
    return sum(len(ea.Scalars(t)) for t in ea.Tags()["scalars"])


def read_kforge(folder: str) -> int:
    from kforge_dash.importers.tensorboard import read_run

    run = read_run(folder, "bench")
    return sum(len(s) for s in run.series.values())


def side_by_side(tmp: str, steps: int, tags: int, repeats: int) -> None:
    folder = os.path.join(tmp, "small")
    write_log(folder, steps, tags)
    times = {"EventAccumulator": [], "kforge reader": []}
    counts = {}
    for _ in range(repeats):
        for name, fn in (("EventAccumulator", read_ea), ("kforge reader", read_kforge)):
            t0 = time.perf_counter()
            counts[name] = fn(folder)
            times[name].append(time.perf_counter() - t0)
    assert counts["EventAccumulator"] == counts["kforge reader"] == steps * tags, counts
    ea, kf = (statistics.median(times[k]) for k in ("EventAccumulator", "kforge reader"))
    print(f"\n{steps} steps x {tags} tags = {steps * tags:,} points, {repeats} interleaved repeats (median)")
    print(f"{'reader':<20}{'median s':>10}{'points/s':>14}")
    for name, t in (("EventAccumulator", ea), ("kforge reader", kf)):
        print(f"{name:<20}{t:>10.3f}{steps * tags / t:>14,.0f}")
    print(f"ratio EventAccumulator / kforge: {ea / kf:.1f}x")


def big(tmp: str, steps: int, tags: int) -> None:
    from kforge_dash.importers.api import import_tensorboard

    folder = os.path.join(tmp, "big", "run")
    t0 = time.perf_counter()
    write_log(folder, steps, tags)
    gen = time.perf_counter() - t0
    t0 = time.perf_counter()
    [res] = import_tensorboard(os.path.join(tmp, "big"), os.path.join(tmp, "root"))
    took = time.perf_counter() - t0
    assert res.outcome is not None and res.outcome.points == steps * tags, res
    scale = 1_000_000 / steps
    print(f"\nwhole import of {steps:,} steps x {tags} tags ({steps * tags:,} points; log written in {gen:.0f} s): {took:.1f} s")
    if scale != 1:
        print(f"1,000,000 steps x {tags} tags, scaled linearly (x{scale:g}): {took * scale:.0f} s  (goal <= 60 s)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=4000)
    p.add_argument("--tags", type=int, default=15)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--big-steps", type=int, default=100_000)
    args = p.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core
    print(f"python {sys.version.split()[0]}, one core; other work on this machine adds noise")
    with tempfile.TemporaryDirectory() as tmp:
        side_by_side(tmp, args.steps, args.tags, args.repeats)
        big(tmp, args.big_steps, args.tags)


if __name__ == "__main__":
    main()
