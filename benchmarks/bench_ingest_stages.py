"""Where one ingest's wall time, CPU time and peak memory go, stage by stage (issue 29, goals 1 and 6).

    python benchmarks/bench_ingest_stages.py RUN                 # RUN: e.g. bench_ingest_vs_duckdb.py --dir D's run
    PYTHONPATH=/work/main python3 benchmarks/bench_ingest_stages.py RUN   # another checkout, same stages

Runs ``ingest_run(RUN, force)`` once in this process with each stage wrapped: the peak RSS is reset
before a stage (/proc/self/clear_refs, Linux) and read after it (VmHWM), so "peak" is the stage's own
high-water mark, "end" the resident set it leaves. Stages nest: the findings (indented) are inside
analyse_run. Nothing of kforge is changed: the wrappers replace module attributes in this process only.
"""

from __future__ import annotations

import argparse
import importlib
import time

FINDINGS = (("perstep", "per_step"), ("goodput", "goodput"), ("spikes", "spike_findings"),
            ("nonfinite", "nonfinite_findings"), ("stragglers", "straggler_findings"), ("timeline", "memory_findings"),
            ("timeline", "data_stall_findings"), ("timeline", "restart_findings"), ("kills", "unrecorded_findings"),
            ("kills", "overlap_findings"), ("missing", "missing_rank_findings"), ("hang", "hang_findings"),
            ("replicas", "replica_divergence_findings"), ("episodes", "slow_episode_findings"),
            ("hardware", "episodes"), ("hardware", "throttle_findings"), ("whatif", "what_if"),
            ("mfu", "mfu_waterfall"))
# The row pass's parts, summed over its windows and batches (module, attribute); the thread they run on in brackets.
ROW_PASS = (("window", "read_window", "main: read window/batch"), ("read", "_scan_together", "main:  parquet scan"),
            ("read", "coalesce_logs", "main:  coalesce log rows"), ("window", "dedup_rows", "main: dedup_rows"),
            ("window", "local_periods", "main: local_periods"), ("window", "arrow_table", "main: arrow_table"),
            ("rows._Acc", "add", "main: periods and steps kept (_Acc.add)"),
            ("ranks_writer.RanksWriter", "put", "main: RanksWriter.put (cast, NaN check, wait)"),
            ("ranks_writer.RanksWriter", "_write", "writer: ranks.parquet write"),
            ("accumulate.StepAcc", "add", "reducer: StepAcc.add"), ("accumulate.StepAcc", "result", "reducer: StepAcc.result"),
            ("window", "reduce_steps", "reducer: reduce_steps"), ("rows", "_stack_steps", "main: _stack_steps"))
RUN_STAGES = ("_list_inputs", "make_plan", "read_rows", "find_rollbacks", "_derive", "_write_outputs", "build_summary",
              "analyse_run")


def _status() -> tuple[float, float]:
    """(VmHWM, VmRSS) in GiB."""
    with open("/proc/self/status") as f:
        got = {line.split(":")[0]: int(line.split()[1]) for line in f if line.startswith(("VmHWM", "VmRSS"))}
    return got["VmHWM"] / 2**20, got["VmRSS"] / 2**20


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _wrap(mod, name: str, label: str, rows: list) -> None:
    fn = getattr(mod, name, None)
    if fn is None:
        return

    def timed(*a, **k):
        _reset_peak()
        t, c = time.perf_counter(), time.process_time()
        try:
            return fn(*a, **k)
        finally:
            rows.append((label, time.perf_counter() - t, time.process_time() - c, *_status()))
    setattr(mod, name, timed)


def _wrap_sum(owner, name: str, label: str, sums: dict) -> None:
    """Sum wall and this thread's CPU time of every call of owner.name, and how far the process's peak RSS
    rose during its calls (threads overlap: a rise is the process's, not the call's alone)."""
    fn = getattr(owner, name, None)
    if fn is None:
        return
    sums[label] = [0, 0.0, 0.0, 0.0]

    def timed(*a, **k):
        t, c, before = time.perf_counter(), time.thread_time(), _status()[0]
        try:
            return fn(*a, **k)
        finally:
            got = sums[label]
            got[0] += 1
            got[1] += time.perf_counter() - t
            got[2] += time.thread_time() - c
            got[3] += _status()[0] - before
    setattr(owner, name, timed)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run")
    args = ap.parse_args()
    t0 = time.perf_counter()
    import kforge_dash
    import kforge_dash.ingest.run as run
    from kforge_dash.ingest.options import IngestOptions
    imported = time.perf_counter() - t0
    rows: list = []
    for name in RUN_STAGES:
        _wrap(run, name, name, rows)
    sums: dict = {}
    for where, name, label in ROW_PASS:
        mod, _, cls = where.partition(".")
        owner = importlib.import_module(f"kforge_dash.ingest.{mod}")
        _wrap_sum(getattr(owner, cls) if cls else owner, name, label, sums)
    for mod, name in FINDINGS:
        _wrap(importlib.import_module(f"kforge_dash.findings.{mod}"), name, f"  {name}", rows)
    t, c = time.perf_counter(), time.process_time()
    run.ingest_run(args.run, IngestOptions(force=True))
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    # (ru_maxrss is reset with VmHWM: the process's peak is its stages' highest)
    print(f"# {kforge_dash.__file__}: import {imported:.2f} s; ingest_run {wall:.2f} s wall, {cpu:.2f} CPU-s; "
          f"peak {max(r[3] for r in rows if not r[0].startswith(' ')):.2f} GiB")
    print("| stage | wall s | CPU s | peak GiB | end GiB |\n| --- | ---: | ---: | ---: | ---: |")
    for label, w, c, peak, end in rows:
        print(f"| {label} | {w:.2f} | {c:.2f} | {peak:.2f} | {end:.2f} |")
    print("\n| row pass part [thread] | calls | wall s | thread CPU s | peak rise GiB |\n| --- | ---: | ---: | ---: | ---: |")
    for label, (n, w, c, rise) in sums.items():
        print(f"| {label} | {n} | {w:.2f} | {c:.2f} | {rise:.2f} |")


if __name__ == "__main__":
    main()
