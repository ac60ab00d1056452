"""Regenerate sample_runs/: real two-rank CPU training runs of examples/train_tiny.py.

    python examples/make_sample_runs.py            # all runs, into sample_runs/ (a few minutes)
    python examples/make_sample_runs.py --only preempted --out /tmp/runs

Each run is launched with torchrun (gloo, two ranks), from a fixed seed, so losses, grad norms and
learning rates are the same on every regeneration; timings are whatever this machine did. The
preempted run is really preempted: once rank 0 reports step PREEMPT_AT, every worker gets SIGTERM
(the recorder flushes its tail), the job exits, and a second launch resumes from the last
checkpoint, which is older than the last recorded step, so the two attempts overlap. Checkpoints go
to a temporary directory, never into sample_runs/. At the end sample_runs/README.md is rewritten
from what is on disk.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass

import pyarrow.parquet as pq

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
TRAIN = os.path.join(HERE, "train_tiny.py")

STEPS = 250
CKPT_EVERY = 50
PREEMPT_AT = 130  # between checkpoints 100 and 150: the resume point (101) is before the kill


@dataclass(frozen=True, kw_only=True)
class Run:
    name: str
    args: tuple[str, ...]
    shows: str
    preempt_at: int | None = None
    nproc: int = 2


# Every run shares seed and shape; only the listed flags differ, so any two can be compared.
RUNS = (
    Run(name="baseline-lr1e-3", args=("--lr", "1e-3", "--tag", "baseline", "--tag", "lr-sweep"),
        shows="baseline; lr sweep (only lr differs)"),
    Run(name="baseline-lr3e-3", args=("--lr", "3e-3", "--tag", "baseline", "--tag", "lr-sweep"),
        shows="baseline; lr sweep (only lr differs)"),
    Run(name="baseline-lr1e-2", args=("--lr", "1e-2", "--tag", "baseline", "--tag", "lr-sweep"),
        shows="baseline; lr sweep (only lr differs)"),
    Run(name="preempted", args=("--lr", "3e-3", "--tag", "preempted"), preempt_at=PREEMPT_AT,
        shows=f"SIGTERM to both workers after step {PREEMPT_AT}; relaunch resumes from the step-100 checkpoint"),
    Run(name="straggler", args=("--lr", "3e-3", "--slow-rank", "1", "--slow-ms", "40", "--tag", "straggler"),
        shows="rank 1 sleeps 40 ms in its data phase every step; rank 0 waits in the all-reduce"),
    Run(name="spike-nan", args=("--lr", "3e-3", "--spike-step", "150", "--spike-lr-mult", "30",
                                "--nan-step", "200", "--tag", "fault-injection"),
        shows="lr x30 at steps 150-151 (loss spike); rank 0 loss NaN at step 200 (optimizer step skipped)"),
    Run(name="four-ranks-stall", nproc=4,
        args=("--lr", "3e-3", "--max-steps", "160", "--slow-rank", "2", "--slow-ms", "80", "--stall-from", "100",
              "--stall-ms", "200", "--tag", "fault-injection"),
        shows="4 ranks: rank 2 sleeps 80 ms in its data phase every step (a straggler among four); from step 100 "
              "every rank's loader sleeps 200 ms (a data stall; the step time regresses)"),
    Run(name="throttled", args=("--lr", "3e-3", "--telemetry-every", "5", "--throttle-rank", "1", "--throttle-from", "100",
                                "--throttle-to", "179", "--throttle-ms", "80", "--tag", "fault-injection"),
        shows="simulated GPU telemetry (hw/ columns) every 5 steps; rank 1's GPU throttles (thermal slowdown, "
              "SM clock 1,980 -> 1,200 MHz) at steps 100-179 and its optimizer step takes 80 ms longer then"),
)


def launch(run_dir: str, ckpt_dir: str, args: tuple[str, ...], *, preempt_at: int | None = None, nproc: int = 2) -> None:
    """One torchrun launch of ``nproc`` ranks; with preempt_at, SIGTERM the workers once rank 0 logs that step."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc), TRAIN,
           "--run-dir", run_dir, "--ckpt-dir", ckpt_dir, "--max-steps", str(STEPS),
           "--ckpt-every", str(CKPT_EVERY), "--log-every", "10", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    pids, sent = [], False
    for line in proc.stdout:
        print("    " + line, end="", flush=True)
        pids += [int(pid) for pid in re.findall(r"rank \d+/\d+ pid (\d+)", line)]
        if preempt_at and not sent and (m := re.match(r"step (\d+) ", line)) and int(m[1]) >= preempt_at:
            # What a scheduler does at preemption: SIGTERM to every worker process of the job.
            assert len(pids) == 2, f"expected two worker pids before step {preempt_at}, got {pids}"
            for pid in pids:
                os.kill(pid, signal.SIGTERM)
            sent = True
    rc = proc.wait()
    if preempt_at:
        if not sent:
            raise RuntimeError(f"run ended (rc {rc}) before step {preempt_at}: nothing was preempted")
    elif rc != 0:
        raise RuntimeError(f"torchrun exited with status {rc}: {' '.join(cmd)}")


def attempts(run_dir: str) -> dict[int, list[tuple[int, int]]]:
    """{rank: [(first_step, last_step) per attempt, in launch order]} from the shards on disk."""
    out = {}
    for rank_dir in sorted(glob.glob(os.path.join(run_dir, "rank-*"))):
        spans = []
        for attempt_dir in glob.glob(os.path.join(rank_dir, "*")):
            with open(os.path.join(attempt_dir, "meta.json")) as f:
                start = json.load(f)["start_time"]
            steps = [s for p in sorted(glob.glob(os.path.join(attempt_dir, "part-*.parquet")))
                     for s in pq.read_table(p, columns=["step"]).column("step").to_pylist()]
            spans.append((start, min(steps), max(steps)))
        out[int(os.path.basename(rank_dir).split("-")[1])] = [(a, b) for _, a, b in sorted(spans)]
    return out


def write_note(out: str) -> None:
    lines = [
        "# sample_runs",
        "",
        "Real training, not generated numbers: each run is a tiny Llama-style character-level GPT",
        "(3 layers, dim 96, ~0.3M parameters) trained on CPU by `examples/train_tiny.py` with two",
        "DDP ranks (gloo), recorded by `kforge_record`. Losses are deterministic from the seed; timings",
        "are real and noisy (a shared two-core machine). `peak_tflops` is this machine's measured fp32",
        "matmul rate, so MFU is defined on CPU. Regenerate (a few minutes):",
        "",
        "    python examples/make_sample_runs.py",
        "",
        "| run | steps | ranks | attempts (steps per attempt) | what it shows |",
        "| --- | --- | --- | --- | --- |",
    ]
    for run in RUNS:
        run_dir = os.path.join(out, run.name)
        if not os.path.isdir(run_dir):
            continue
        spans = attempts(run_dir)[0]
        ranks = len(attempts(run_dir))
        steps = f"{min(a for a, _ in spans)}-{max(b for _, b in spans)}"
        per = ", ".join(f"{a}-{b}" for a, b in spans)
        lines.append(f"| {run.name} | {steps} | {ranks} | {len(spans)} ({per}) | {run.shows} |")
    lines += ["", "Flags of each run: see `RUNS` in `examples/make_sample_runs.py`. `ingested/` is ignored by git.", ""]
    with open(os.path.join(out, "README.md"), "w") as f:
        f.write("\n".join(lines))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.path.join(REPO, "sample_runs"), help="runs root (default: sample_runs/)")
    p.add_argument("--only", action="append", choices=[r.name for r in RUNS], help="make only this run (repeatable)")
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="kforge-ckpt-") as ckpt_dir:
        for run in RUNS:
            if args.only and run.name not in args.only:
                continue
            run_dir = os.path.join(args.out, run.name)
            shutil.rmtree(run_dir, ignore_errors=True)  # a fresh run: old shards would be extra attempts
            print(f"== {run.name}: {' '.join(run.args)}", flush=True)
            launch(run_dir, ckpt_dir, run.args, preempt_at=run.preempt_at, nproc=run.nproc)
            if run.preempt_at:
                print(f"== {run.name}: relaunch (resumes from the last checkpoint)", flush=True)
                launch(run_dir, ckpt_dir, run.args)
                for rank, spans in attempts(run_dir).items():
                    (_, last0), (first1, _) = spans
                    if not first1 <= last0:
                        raise RuntimeError(f"rank {rank}: attempts do not overlap ({spans}); the kill came too late")
    write_note(args.out)
    print(open(os.path.join(args.out, "README.md")).read())


if __name__ == "__main__":
    main()
