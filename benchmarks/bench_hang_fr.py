#!/usr/bin/env python
"""What kforge-hang's analysis (analyze_fr) costs on a hung job of many ranks, from dumps in memory.

A synthetic NCCL job: N ranks in TP groups of 8 and one world group, each rank's buffer holding E
completed entries and its pending tail; rank 17 never issues its TP group's next all_gather, its TP
peers wait in it, and every other rank waits in the world all_reduce that those never reached.

    python benchmarks/bench_hang_fr.py            # N = 512, 4096; E = 200
    python benchmarks/bench_hang_fr.py --quick    # N = 512

Prints the median wall time of analyze_fr over the repeats, and the ranks it names (must be 17).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from time import perf_counter

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kforge_dash.ingest.flight_recorder import analyze_fr  # noqa: E402

TP = 8
CULPRIT = 17


def _entry(i, pg_id, name, desc, seq, state):
    return {"record_id": i, "pg_id": pg_id, "process_group": (name, desc), "collective_seq_id": seq, "p2p_seq_id": 0,
            "is_p2p": False, "profiling_name": "nccl:_all_gather_base" if pg_id else "nccl:all_reduce", "state": state,
            "input_sizes": [[1024, 4096]], "output_sizes": [[8192, 4096]], "input_dtypes": ["BFloat16"],
            "output_dtypes": ["BFloat16"], "time_created_ns": 1_000_000 + i, "retired": False}


def job(n: int, e: int) -> dict[int, dict]:
    dumps = {}
    for r in range(n):
        tp = r // TP
        tp_name = str(1 + tp)
        entries, seq_w, seq_t = [], 0, 0
        for i in range(e):  # completed: one world all_reduce per 4 TP all_gathers
            if i % 5 == 4:
                seq_w += 1
                entries.append(_entry(i, 0, "0", "default_pg", seq_w, "completed"))
            else:
                seq_t += 1
                entries.append(_entry(i, 1, tp_name, "TENSOR_MODEL_PARALLEL_GROUP", seq_t, "completed"))
        stuck_tp = tp == CULPRIT // TP
        if r != CULPRIT:
            entries.append(_entry(e, 1, tp_name, "TENSOR_MODEL_PARALLEL_GROUP", seq_t + 1, "scheduled"))
            if not stuck_tp:
                entries.append(_entry(e + 1, 0, "0", "default_pg", seq_w + 1, "scheduled"))
                entries[-2]["state"] = "completed"  # their TP group went on; they wait in the world group
        config = {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(n)))},
                  tp_name: {"name": tp_name, "desc": "TENSOR_MODEL_PARALLEL_GROUP",
                            "ranks": str(list(range(tp * TP, tp * TP + TP)))}}
        pending = [x for x in entries if x["state"] != "completed"]
        status = {str(pg): {"last_enqueued_collective": max(x["collective_seq_id"] for x in entries if x["pg_id"] == pg),
                            "last_started_collective": -1,
                            "last_completed_collective": max((x["collective_seq_id"] for x in entries
                                                              if x["pg_id"] == pg and x not in pending), default=0)}
                  for pg in (0, 1)}
        dumps[r] = {"version": "2.9", "pg_config": config, "pg_status": status, "entries": entries}
    return dumps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--entries", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    print(f"{'ranks':>6} {'entries':>8} {'analyze_fr s':>13}  named")
    for n in (512,) if args.quick else (512, 4096):
        dumps = job(n, args.entries)
        times, v = [], None
        for _ in range(args.repeats):
            t0 = perf_counter()
            v = analyze_fr(dumps)
            times.append(perf_counter() - t0)
        print(f"{n:>6} {args.entries:>8} {statistics.median(times):>13.2f}  {v.ranks}")


if __name__ == "__main__":
    main()
