#!/usr/bin/env python
"""What logging one training step costs: kforge_record next to wandb offline, TensorBoard and a floor.

Every contender gets the same 11 per-step fields (step + the 10 in FIELDS below), with the same
values, in the call shape its users write:

  floor     rows.append({"step": step, **metrics})          keeping a dict per step, nothing else
  kforge    rec.end_step(step, **metrics)                   the recorder, writer thread running
  wandb     run.log(metrics, step=step)                     mode="offline", console off, no stats
  tensorb.  writer.add_scalar(name, value, step) per field  torch.utils.tensorboard.SummaryWriter

Then the recorder's memory at several step counts (one fresh child process per mode).

    python benchmarks/bench_record.py              # calls back to back, warm (~2-3 min on 2 busy cores)
    python benchmarks/bench_record.py --quick      # smoke run, small counts
    python benchmarks/bench_record.py --behind-only  # only: a loop faster than the writer thread
    python benchmarks/bench_record.py --merge --steps 100000   # merging part files on vs off only
    python benchmarks/bench_record_ab.py           # the hot path against an earlier commit (fresh processes)
    python benchmarks/bench_record_cold.py         # the same contenders cold: calls 1 ms apart, as a loop pays them

The machine may be shared: contenders run interleaved within each repeat (in a rotating order) so
that a noisy neighbour hits all of them alike, and every figure is a median over the repeats.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
import warnings
from time import perf_counter

# Run from a plain checkout too (the package need not be installed).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# A training process has torch imported; the recorder's writer behaves differently when it has
# (it looks for tensors to copy), so the benchmark imports it for every contender.
import torch  # noqa: E402

from kforge_record import Recorder  # noqa: E402

# The per-step fields, defined once. With "step" that is 11. Phase timers use the recorder's own
# column names (what `with rec.phase("data")` writes), so every contender stores the same names.
FIELDS = (
    "loss", "grad_norm", "lr", "tokens",                        # the recorder's fixed columns
    "time/data_s", "time/fwd_bwd_s", "time/optimizer_s",        # 3 phase timers
    "moe/aux_loss", "moe/load_imbalance", "train/ppl",          # 3 user scalars
)
# The values that are tensors in a real loop (loss, clip_grad_norm_'s result, model outputs);
# used only for the recorder's tensor row. lr, tokens and host timers stay Python numbers.
TENSOR_FIELDS = ("loss", "grad_norm", "moe/aux_loss", "moe/load_imbalance", "train/ppl")

FLUSH_EVERY_STEPS = 100  # the recorder's default; memory should be bounded by this, not by steps
# "Paced" timing loops wait (untimed) for the writer after every flush window, so the timed
# end_step calls meet an idle writer, as they do in training, where a window of 100 steps lasts
# seconds and the writer needs a few ms of it. The paced memory run lets the writer fall up to
# MEM_PACE_WINDOWS windows behind instead: 1M steps are 10,000 windows, and a wait at each would
# mostly measure thread wake-ups on a busy machine.
MEM_PACE_WINDOWS = 10
POOL = 1024  # distinct value sets, cycled: varied values without a 1M-entry list skewing memory


def make_pool(tensors: bool) -> list[dict]:
    """POOL metric dicts with plausible, varied values (seeded: every run feeds the same)."""
    rng = random.Random(0)
    pool = []
    for _ in range(POOL):
        m = {
            "loss": rng.uniform(1.5, 3.0),
            "grad_norm": rng.uniform(0.2, 2.0),
            "lr": rng.uniform(1e-5, 3e-4),
            "tokens": rng.randrange(3000, 4097),
            "time/data_s": rng.uniform(0.001, 0.01),
            "time/fwd_bwd_s": rng.uniform(0.2, 0.3),
            "time/optimizer_s": rng.uniform(0.01, 0.03),
            "moe/aux_loss": rng.uniform(0.0, 0.05),
            "moe/load_imbalance": rng.uniform(1.0, 1.5),
            "train/ppl": rng.uniform(5.0, 20.0),
        }
        assert tuple(m) == FIELDS
        if tensors:
            for name in TENSOR_FIELDS:
                m[name] = torch.tensor(m[name])  # 0-dim CPU tensor, as `loss` is in a loop
        pool.append(m)
    return pool


# --------------------------------------------------------------------------------------------
# One timed run per contender. Each returns (loop_s, close_s, bg_cpu_s): wall time of the
# logging loop, wall time of close()/finish(), and CPU spent by the process's *other* threads
# (the recorder's writer, wandb's and TensorBoard's helper threads) over loop + close: work the
# loop did not pay for on its own thread but that still competes for the cores and the GIL.
# --------------------------------------------------------------------------------------------


def _clocks():
    return perf_counter(), time.process_time(), time.thread_time()


def _result(c0, c1, c2):
    (w0, p0, m0), (w1, _, _), (w2, p2, m2) = c0, c1, c2
    return w1 - w0, w2 - w1, max(0.0, (p2 - p0) - (m2 - m0))


def run_floor(pool, steps, tmp):
    rows = []
    gc.collect()
    c0 = _clocks()
    for step in range(1, steps + 1):
        m = pool[step & (POOL - 1)]
        rows.append({"step": step, **m})
    c1 = _clocks()
    c2 = _clocks()
    del rows
    return _result(c0, c1, c2)


def _new_recorder(tmp, merge_parts=True, cls=None):
    d = tempfile.mkdtemp(dir=tmp)
    rec = (cls or Recorder)(os.path.join(d, "run"), flush_every_steps=FLUSH_EVERY_STEPS, install_sigterm_handler=False,
                   merge_parts=merge_parts)
    return d, rec


def _check_recorder(rec, steps):
    # A benchmark that silently recorded nothing would look very fast: prove every row landed.
    with open(os.path.join(rec.attempt_dir, "end.json")) as f:
        end = json.load(f)
    if end["rows_written"] != steps or end["dropped_rows_total"]:
        raise SystemExit(f"recorder wrote {end['rows_written']} rows of {steps} (dropped {end['dropped_rows_total']})")


# The recorder runs paced or back to back. Paced: after each flush window the loop waits,
# untimed, until the writer has written it, which is what real steps of milliseconds give the
# writer for free; the timed part is what the training thread itself pays (handoff included) and
# the writer's work shows in the other-threads CPU column. Back to back: end_step ~100x faster
# than any real step, so the writer falls behind and batches queue up until close(); that is
# the stress case (the GIL is shared with a writer that never catches up). The loops are written
# out, not factored into a helper, so that no extra call sits in the timed path.


def _close_and_measure(rec, d, steps, p0, m0):
    """close() time, and the CPU the recorder's other threads used since (p0, m0)."""
    t1 = perf_counter()
    rec.close()
    w2, p2, m2 = _clocks()
    _check_recorder(rec, steps)
    shutil.rmtree(d)
    return w2 - t1, max(0.0, (p2 - p0) - (m2 - m0))


def run_kforge(pool, steps, tmp, paced=True, merge_parts=True):
    d, rec = _new_recorder(tmp, merge_parts)
    gc.collect()
    w0, p0, m0 = _clocks()
    if paced:
        loop_s = 0.0
        for first in range(1, steps + 1, FLUSH_EVERY_STEPS):
            t0 = perf_counter()
            for step in range(first, first + FLUSH_EVERY_STEPS):
                m = pool[step & (POOL - 1)]
                rec.end_step(step, **m)
            loop_s += perf_counter() - t0
            rec.flush()  # nothing is buffered at this point: this only waits for the writer
    else:
        for step in range(1, steps + 1):
            m = pool[step & (POOL - 1)]
            rec.end_step(step, **m)
        loop_s = perf_counter() - w0
    return (loop_s, *_close_and_measure(rec, d, steps, p0, m0))


def run_kforge_back_to_back(pool, steps, tmp):
    return run_kforge(pool, steps, tmp, paced=False)


def run_kforge_unmerged(pool, steps, tmp):
    return run_kforge(pool, steps, tmp, merge_parts=False)


def run_kforge_back_to_back_unmerged(pool, steps, tmp):
    return run_kforge(pool, steps, tmp, paced=False, merge_parts=False)


def run_kforge_phases(pool, steps, tmp):
    # What a user's loop runs around its work: start_step, three `with rec.phase()` blocks and
    # end_step. The phase timers are then the recorder's own, so they are not passed again.
    pool = [{k: v for k, v in m.items() if not k.startswith("time/")} for m in pool]
    d, rec = _new_recorder(tmp)
    gc.collect()
    w0, p0, m0 = _clocks()
    loop_s = 0.0
    for first in range(1, steps + 1, FLUSH_EVERY_STEPS):  # paced, as in run_kforge
        t0 = perf_counter()
        for step in range(first, first + FLUSH_EVERY_STEPS):
            m = pool[step & (POOL - 1)]
            rec.start_step()
            with rec.phase("data"):
                pass
            with rec.phase("fwd_bwd"):
                pass
            with rec.phase("optimizer"):
                pass
            rec.end_step(step, **m)
        loop_s += perf_counter() - t0
        rec.flush()
    return (loop_s, *_close_and_measure(rec, d, steps, p0, m0))


def wandb_offline_run(d: str):
    """A wandb run as the benchmarks time it: offline, no console capture, no system stats."""
    import wandb

    settings = wandb.Settings(console="off", x_disable_stats=True, x_disable_meta=True, x_disable_machine_info=True,
                              disable_git=True, disable_code=True, silent=True)
    return wandb.init(mode="offline", dir=d, project="kforge-bench", settings=settings)


def run_wandb(pool, steps, tmp):
    d = tempfile.mkdtemp(dir=tmp)
    run = wandb_offline_run(d)  # not timed
    gc.collect()
    c0 = _clocks()
    for step in range(1, steps + 1):
        m = pool[step & (POOL - 1)]
        run.log(m, step=step)
    c1 = _clocks()
    run.finish()
    c2 = _clocks()
    shutil.rmtree(d, ignore_errors=True)
    return _result(c0, c1, c2)


def run_tensorboard(pool, steps, tmp):
    from torch.utils.tensorboard import SummaryWriter

    d = tempfile.mkdtemp(dir=tmp)
    writer = SummaryWriter(log_dir=d)  # defaults: queue of 10 events, flush every 120 s
    gc.collect()
    c0 = _clocks()
    for step in range(1, steps + 1):
        m = pool[step & (POOL - 1)]
        for name, value in m.items():
            writer.add_scalar(name, value, step)
    c1 = _clocks()
    writer.close()
    c2 = _clocks()
    shutil.rmtree(d, ignore_errors=True)
    return _result(c0, c1, c2)


# --------------------------------------------------------------------------------------------
# A loop faster than the writer (issue 11 item 2): does every row land, and what does it cost?
# --------------------------------------------------------------------------------------------

WIDE_NAMES = tuple(f"layer{i:03d}/grad_norm" for i in range(300))


def run_behind(case: str, steps: int, tmp: str) -> dict:
    """One recorder with default options. "back to back": end_step with nothing between (the 11
    fields). "300 scalars, 0.2 ms": 300 user scalars a step and 0.2 ms of busy work (GIL held, as a
    loop spinning on its GPU queue) between steps."""
    d = tempfile.mkdtemp(dir=tmp)
    rec = Recorder(os.path.join(d, "run"), install_sigterm_handler=False)
    pool = make_pool(False)
    wide = dict.fromkeys(WIDE_NAMES, 0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = perf_counter()
        for step in range(1, steps + 1):
            if case == "back to back":
                rec.end_step(step, **pool[step & (POOL - 1)])
            else:
                rec.end_step(step, loss=1.0, **wide)
                t = perf_counter() + 0.0002
                while perf_counter() < t:
                    pass
        loop_s = perf_counter() - t0
        rec.close()
    with open(os.path.join(rec.attempt_dir, "end.json")) as f:
        end = json.load(f)
    shutil.rmtree(d)
    return {"us": loop_s / steps * 1e6, "written": end["rows_written"], "dropped": end["dropped_rows_total"],
            "parts": end["parts_written"], "wait_s": end.get("writer_wait_s")}


def print_behind(steps_b2b: int, steps_wide: int, repeats: int) -> None:
    cases = [("back to back", steps_b2b), ("300 scalars, 0.2 ms", steps_wide)]
    tmp = tempfile.mkdtemp(prefix="kforge-bench-behind-")
    try:
        got = {c: [] for c, _ in cases}
        for r in range(repeats):
            for case, steps in (cases if r % 2 == 0 else cases[::-1]):
                got[case].append(run_behind(case, steps, tmp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print()
    print(f"A loop faster than the writer thread (default options), median of {repeats} repeats")
    print()
    print("| loop | steps | µs/step | rows written | rows dropped | part files | end_step waited (s) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for case, steps in cases:
        rs = got[case]
        med = {k: statistics.median(x[k] for x in rs) if rs[0][k] is not None else None for k in rs[0]}
        wait = "n/a" if med["wait_s"] is None else f"{med['wait_s']:.2f}"
        print(f"| {case} | {steps:,} | {med['us']:.1f} | {med['written']:,.0f} | {med['dropped']:,.0f} | "
              f"{med['parts']:,.0f} | {wait} |", flush=True)


# --------------------------------------------------------------------------------------------
# Memory: one fresh child process per mode (so RSS peaks do not carry over between modes), read
# at each checkpoint N: the peaks over steps 1..N.
# --------------------------------------------------------------------------------------------


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _reset_peak_rss() -> bool:
    # Linux: writing 5 to clear_refs resets VmHWM, so the peak covers the run and not imports.
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak_rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def mem_child(mode: str, checkpoints: list[int], tmp: str) -> None:
    """Record float steps up to max(checkpoints); print one JSON line per checkpoint N with the
    tracemalloc peak and the RSS peak over steps 1..N, both above the level before step 1.

    mode "paced": every MEM_PACE_WINDOWS flush windows the loop waits for the writer (rec.flush()), as
    real steps of milliseconds let it: the recorder then holds at most that many windows of rows. mode "back-to-back":
    end_step with nothing between, a handoff every ~0.3 ms, faster than the writer turns a batch
    into a part file (Parquet + two fsyncs, sharing the GIL with the loop), so handed-over batches
    queue up. That mode exits without close(): memory peaks at the end of the loop, and draining
    thousands of queued parts would only take minutes and shrink it.
    """
    pool = make_pool(tensors=False)
    rec = Recorder(os.path.join(tmp, "run"), flush_every_steps=FLUSH_EVERY_STEPS, install_sigterm_handler=False)
    # Warm up (pyarrow, zstd, the writer thread) before taking the baselines.
    first = 10 * FLUSH_EVERY_STEPS + 1
    for step in range(1, first):
        rec.end_step(step, **pool[step & (POOL - 1)])
    rec.flush()
    gc.collect()
    tracemalloc.start()
    traced0 = tracemalloc.get_traced_memory()[0]
    hwm_ok = _reset_peak_rss()
    rss0 = max_rss = _rss_bytes()
    max_queued = 0
    todo = sorted(checkpoints)
    for n in range(1, todo[-1] + 1):
        step = first - 1 + n
        rec.end_step(step, **pool[step & (POOL - 1)])
        if n % FLUSH_EVERY_STEPS == 0:
            max_rss = max(max_rss, _rss_bytes())  # sampled too, in case VmHWM cannot be reset
            if mode == "paced":
                if n % (MEM_PACE_WINDOWS * FLUSH_EVERY_STEPS) == 0:
                    rec.flush()
            else:
                # Diagnostic only (a private attribute): rows handed over, not yet taken by the writer.
                max_queued = max(max_queued, rec._writer.inbox.waiting_rows)
        if n == todo[0]:
            todo.pop(0)
            if hwm_ok:
                max_rss = max(max_rss, _peak_rss_bytes())
            print(json.dumps({
                "steps": n, "traced_peak": tracemalloc.get_traced_memory()[1] - traced0,
                "rss_growth": max(0, max_rss - rss0), "max_queued_rows": max_queued,
            }), flush=True)
    if mode == "paced":
        rec.close()
    else:
        os._exit(0)  # skip the drain (see above); the parent deletes the directory


def run_mem(mode: str, checkpoints: list[int]) -> dict[int, dict]:
    tmp = tempfile.mkdtemp(prefix="kforge-bench-mem-")
    try:
        out = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--mem-child", mode, ",".join(map(str, checkpoints)), tmp],
            check=True, capture_output=True, text=True,
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    return {r["steps"]: r for r in rows}


# --------------------------------------------------------------------------------------------


def fmt_mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=30_000, help="steps per repeat for the recorder (the floor runs 4x as many)")
    ap.add_argument("--slow-steps", type=int, default=None,
                    help="steps per repeat for wandb and TensorBoard (default: --steps / 10)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--mem-steps", default="100000,300000,1000000", help="step counts for the memory table")
    ap.add_argument("--quick", action="store_true", help="small counts: a smoke run of every part")
    ap.add_argument("--behind-only", action="store_true", help="only the writer-behind table (1M + 50k steps)")
    ap.add_argument("--merge", action="store_true",
                    help="only the recorder, merging its part files (the default) vs not: the cost of kforge_record/compact.py")
    ap.add_argument("--mem-child", nargs=3, metavar=("MODE", "STEPS", "DIR"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    t_start = perf_counter()

    warnings.filterwarnings("ignore", category=DeprecationWarning)
    if args.mem_child:
        mem_child(args.mem_child[0], [int(n) for n in args.mem_child[1].split(",")], args.mem_child[2])
        return
    if args.behind_only:
        print_behind(1_000_000, 50_000, 3)
        return
    if args.quick:
        args.steps, args.repeats, args.mem_steps = 10_000, 3, "10000,30000,100000"
    # The paced loops wait after every flush window: whole windows only.
    args.steps = -(-args.steps // FLUSH_EVERY_STEPS) * FLUSH_EVERY_STEPS
    # wandb and SummaryWriter cost ~100x more per step: fewer steps give them a similar wall time.
    slow_steps = args.slow_steps or max(500, args.steps // 10)
    mem_steps = [int(s) for s in args.mem_steps.split(",")]
    os.environ["WANDB_SILENT"] = "true"
    os.environ.setdefault("WANDB_MODE", "offline")

    import pyarrow
    import tensorboard
    import wandb

    print(f"# kforge_record benchmark  {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC")
    print(f"# {' '.join([os.path.basename(sys.executable)] + sys.argv)}")
    print(f"# python {platform.python_version()}, torch {torch.__version__}, pyarrow {pyarrow.__version__}, "
          f"wandb {wandb.__version__}, tensorboard {tensorboard.__version__}, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.2f}")

    floats, tensors = make_pool(False), make_pool(True)
    contenders = [  # (label, function, pool, steps)
        # The floor's loop is so short that one preemption skews it: it gets more steps.
        ("floor: list.append(dict)", run_floor, floats, 4 * args.steps),
        ("kforge Recorder.end_step, paced", run_kforge, floats, args.steps),
        ("kforge end_step, back to back", run_kforge_back_to_back, floats, args.steps),
        ("kforge end_step, tensors, paced", run_kforge, tensors, args.steps),
        ("kforge end_step, tensors, back to back", run_kforge_back_to_back, tensors, args.steps),
        ("kforge start_step + 3 phase() + end_step, paced", run_kforge_phases, floats, args.steps),
        ("wandb offline run.log", run_wandb, floats, slow_steps),
        ("SummaryWriter.add_scalar × 10 fields", run_tensorboard, floats, slow_steps),
    ]
    if args.merge:
        contenders = [
            ("floor: list.append(dict)", run_floor, floats, 4 * args.steps),
            ("kforge end_step, paced, merge_parts=True", run_kforge, floats, args.steps),
            ("kforge end_step, paced, merge_parts=False", run_kforge_unmerged, floats, args.steps),
            ("kforge end_step, back to back, merge_parts=True", run_kforge_back_to_back, floats, args.steps),
            ("kforge end_step, back to back, merge_parts=False", run_kforge_back_to_back_unmerged, floats, args.steps),
        ]
    tmp = tempfile.mkdtemp(prefix="kforge-bench-")
    try:
        # Warm-up, untimed: imports, pyarrow/zstd initialisation, wandb's service process.
        for _, fn, pool, steps in contenders:
            fn(pool, max(200, steps // 20), tmp)
        results = {label: [] for label, *_ in contenders}
        for r in range(args.repeats):
            k = r % len(contenders)
            for label, fn, pool, steps in contenders[k:] + contenders[:k]:
                loop_s, close_s, bg_s = fn(pool, steps, tmp)
                results[label].append((loop_s, close_s, bg_s))
            print(f"# repeat {r + 1}/{args.repeats} done", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    def med(label, i, steps):
        return statistics.median(x[i] for x in results[label]) / steps

    floor_us = med(contenders[0][0], 0, contenders[0][3]) * 1e6
    kforge_us = med(contenders[1][0], 0, args.steps) * 1e6
    print()
    print(f"Per-step cost, 11 fields per step, median of {args.repeats} repeats "
          f"(recorder: flush_every_steps={FLUSH_EVERY_STEPS}, writer thread running)")
    print()
    print("| contender | steps/repeat | µs/step | × floor | × kforge | close ms | µs/step incl. close | other threads CPU µs/step |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for label, _, _, steps in contenders:
        us = med(label, 0, steps) * 1e6
        close_ms = statistics.median(x[1] for x in results[label]) * 1e3
        all_in = statistics.median((x[0] + x[1]) for x in results[label]) / steps * 1e6
        bg = med(label, 2, steps) * 1e6
        print(f"| {label} | {steps:,} | {us:.2f} | {us / floor_us:.1f} | {us / kforge_us:.2f} | "
              f"{close_ms:.1f} | {all_in:.2f} | {bg:.2f} |")
    print()
    print("µs/step: wall time of the logging loop / steps; the ratios are on it. close: Recorder.close(), "
          "run.finish(),\nSummaryWriter.close(): waits for what background threads had not written yet. "
          "other threads CPU: CPU\ntime of this process's other threads (the recorder's writer) over loop "
          "+ close, per step; wandb's separate\nservice process is not counted. paced: after every flush window the "
          "loop waits (untimed) until the writer\nhas written it, as steps of milliseconds let it; back to "
          "back: the writer falls behind and end_step waits for it (see the table below).\ntensors: loss, grad_norm and "
          "the 3 user scalars are 0-dim CPU tensors (wandb and TensorBoard get floats).")
    print(f"Goal (issue 2): at most 5 µs per step. kforge end_step, paced: {kforge_us:.2f} µs "
          f"({'met' if kforge_us <= 5 else 'NOT met'}).")
    if args.merge:
        on, off = (med(f"kforge end_step, paced, merge_parts={m}", 2, args.steps) * 1e6 for m in (True, False))
        print(f"Goal (issue 12): the writer thread's CPU per step with merging at most 2x without: "
              f"{on:.2f} / {off:.2f} µs = {on / off:.2f}x ({'met' if on <= 2 * off else 'NOT met'}).")
        print(f"\n# whole run: {(perf_counter() - t_start) / 60:.1f} min")
        return

    print_behind(100_000 if args.quick else 1_000_000, 5_000 if args.quick else 50_000, 1 if args.quick else 3)

    print()
    print(f"Recorder memory over N steps (floats, flush_every_steps={FLUSH_EVERY_STEPS}), "
          "one fresh process per mode, peaks over steps 1..N")
    print()
    print("| steps | paced: traced peak | paced: RSS growth | back to back: traced peak | back to back: RSS growth | back to back: rows queued for the writer (max seen) |")
    print("|---:|---:|---:|---:|---:|---:|")
    paced, b2b = run_mem("paced", mem_steps), run_mem("back-to-back", mem_steps)
    for n in mem_steps:
        p, t = paced[n], b2b[n]
        print(f"| {n:,} | {fmt_mib(p['traced_peak'])} | {fmt_mib(p['rss_growth'])} | "
              f"{fmt_mib(t['traced_peak'])} | {fmt_mib(t['rss_growth'])} | {t['max_queued_rows']:,} |", flush=True)
    print()
    print("traced peak: tracemalloc peak of Python allocations during the run, above the level before it. "
          "RSS growth:\npeak RSS minus RSS before the run (includes pyarrow's buffers and tracemalloc's own "
          f"bookkeeping). paced: the writer\nis at most {MEM_PACE_WINDOWS} flush windows behind, as steps of a millisecond "
          f"or more keep it. back to back: end_step\nwith nothing between; the writer falls behind, merges the windows queued meanwhile into one "
          "part,\nand end_step waits once max(2 windows, 256 rows) are pending: nothing is dropped.")
    print(f"\n# whole run: {(perf_counter() - t_start) / 60:.1f} min")


if __name__ == "__main__":
    main()
