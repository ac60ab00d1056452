#!/usr/bin/env python
"""kforge's training time, tokens/s, MFU and loss side by side with KempnerForge's own figures, on
real 2-rank FSDP2 runs of KempnerForge's own scripts/train.py on CPU (gloo) with per-rank jitter
(issue 27).

    python benchmarks/side_by_side_kempnerforge.py --kempnerforge PATH [--runs 3] [--steps 400] [--jitter-ms 6]

PATH: a KempnerForge checkout (github.com/KempnerInstitute/KempnerForge), run from there. Per run,
in a temp folder: a tiny dense model TOML (2 layers, dim 64, vocab 256, seq_len 64, batch 4 x 2
accumulation steps, fp32, no compile, log_interval 1, distributed.backend "gloo", KempnerForge's
synthetic random-token batches), and a copy of its
scripts/train.py with the import swapped as docs/frameworks.md tells a user (kforge's drop-in
MetricsTracker) and one harness edit: the tracker is a tee of KempnerForge's OWN MetricsTracker
and kforge's drop-in, called at the same points (KempnerForge's timer outermost: its step window
holds kforge's calls), so one run gives both sides. Each edit is an exact text substitution that
must match once; KempnerForge's maths and metric code are untouched.

The harness module (benchmarks/kempnerforge_harness.py, copied beside it as kf_harness.py) also makes
KempnerForge run on a CPU-only torch, where three lines of it assume CUDA (stated plainly, nothing else
changed): torch.cuda.set_device becomes a no-op, init_distributed's init_device_mesh("cuda", ...) gets
"cpu", and NaNDetector's all-reduced NaN flag, a torch.tensor(device="cuda"), is made on the CPU. Each
rank sleeps uniform(0, jitter) ms at the top of each step (inside both trackers' windows; its own RNG), so the
ranks wait for each other at FSDP2's collectives. KempnerForge's own figures are taken from what its
tracker logs: a logging backend of its own kind (_LoggingBackend) appended to its tracker's
backends writes each logged dict (train/loss, train/tokens_per_sec, train/mfu, train/step_time_sec,
full precision) to a JSON-lines file on rank 0; rank 0's printed lines are parsed for the loss
check (the drop-in's copy of the line is silenced).

Definitions: KempnerForge's tokens/s divides the step's global tokens by RANK 0's own start_step ->
end_step time, kforge's by the job's period between step ends (ingested with --peak-tflops 1.0, its
CPU peak); the last column, kforge's rank-0 Σ own work over its Σ step_time, is like with like. Figures: docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import polars as pl

ROOT = Path(__file__).resolve().parent.parent
TOML = """\
[model]
dim = 64
n_layers = 2
n_heads = 4
n_kv_heads = 4
vocab_size = 256
max_seq_len = 64
[train]
batch_size = 4
seq_len = 64
max_steps = {steps}
grad_accum_steps = 2
grad_clip_norm = 1.0
seed = {seed}
compile_model = false
mixed_precision = "fp32"
[optimizer]
name = "adamw"
lr = 3e-4
[scheduler]
name = "cosine"
warmup_steps = 10
[distributed]
backend = "gloo"
[checkpoint]
dir = "{work}/checkpoints"
interval = 1000000
[metrics]
log_interval = {log_interval}
"""

HARNESS = Path(__file__).resolve().parent / "kempnerforge_harness.py"  # copied beside train.py as kf_harness.py

# (what, old text, new text): each old text must occur exactly once in KempnerForge's scripts/train.py.
PATCHES = (
    ("kforge import (the user's swap)", "from kempnerforge.metrics.tracker import MetricsTracker\n",
     "from kforge_record.integrations.kempnerforge import MetricsTracker  # kforge\n"
     "from kempnerforge.metrics.tracker import MetricsTracker as _KFOwnTracker  # harness: its own, beside\n"
     "import kf_harness  # harness: CPU, the tee, jitter\n"),
    ("harness: both trackers", "    tracker = MetricsTracker(config, num_gpus=world_size)\n",
     "    tracker = kf_harness.Tee(_KFOwnTracker(config, num_gpus=world_size),  # harness\n"
     "                             MetricsTracker(config, num_gpus=world_size))\n"),
)
LINE = re.compile(r"\[step (\d+)\] loss=(\S+) \| lr=\S+ \| grad_norm=\S+ \| tok/s=([\d,]+) \| mfu=([\d.]+)% \|")


def patched_train_py(source: str) -> str:
    """KempnerForge's scripts/train.py with the PATCHES applied; a ValueError names one not there once."""
    for what, old, new in PATCHES:
        n = source.count(old)
        if n != 1:
            raise ValueError(f"train.py: the text for '{what}' occurs {n} times, not once (another KempnerForge?)")
        source = source.replace(old, new)
    return source


@dataclass(frozen=True)
class OwnLog:
    """KempnerForge's own figures: per step what its tracker logged, and rank 0's printed loss text."""

    steps: list[int]
    loss: list[float]
    tokens_per_s: list[float]
    mfu: list[float]
    step_time_s: list[float]
    printed_loss: dict[int, str]
    kforge_calls_s: float  # rank 0's time in the drop-in's start_step/end_step calls (inside its windows)


def read_own(jsonl: Path, stdout: str) -> OwnLog:
    rows = [json.loads(line) for line in jsonl.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if "train/step_time_sec" in r]
    if not rows:
        raise SystemExit(f"KempnerForge's tracker logged nothing to {jsonl}:\n{stdout[-2000:]}")
    printed = {int(m.group(1)): m.group(2) for m in LINE.finditer(stdout)}
    calls = json.loads(Path(f"{jsonl}.calls").read_text())["kforge_calls_s"]
    return OwnLog([r["step"] for r in rows], [r["train/loss"] for r in rows], [r["train/tokens_per_sec"] for r in rows],
                  [r["train/mfu"] for r in rows], [r["train/step_time_sec"] for r in rows], printed, calls)


def run_once(kf: Path, work: Path, args: argparse.Namespace, seed: int) -> tuple[OwnLog, Path]:
    """One torchrun of the patched train.py in ``work``; KempnerForge's own log and the kforge run folder."""
    work.mkdir(parents=True)
    (work / "train.py").write_text(patched_train_py((kf / "scripts" / "train.py").read_text()))
    shutil.copy(HARNESS, work / "kf_harness.py")
    (work / "tiny.toml").write_text(TOML.format(steps=args.steps, seed=seed, work=work, log_interval=args.log_interval))
    run, own = work / "kforge-run", work / "kempnerforge-own.jsonl"
    logs = work / "torchrun-logs"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.world}",
           f"--log-dir={logs}", "--redirects=3", "train.py", "tiny.toml"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "KFORGE_DIR": str(run), "KF_OWN_LOG": str(own),
           "KFORGE_JITTER_MS": str(args.jitter_ms),
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(kf), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=1800)
    rank0 = "".join(p.read_text() for p in sorted(logs.glob("*/attempt_0/0/std*.log")))
    (work / "kempnerforge.log").write_text(rank0)
    if proc.returncode:
        errs = "".join(p.read_text()[-3000:] for p in sorted(logs.glob("*/attempt_0/*/stderr.log")))
        raise SystemExit(f"torchrun failed ({proc.returncode})\n{proc.stderr[-2000:]}\n{errs}")
    ingest = subprocess.run([sys.executable, "-m", "kforge_dash.cli.ingest", str(run), "--no-tensorboard", "--no-wandb",
                             "--quiet", "--peak-tflops", str(args.peak_tflops)],
                            env=env, capture_output=True, text=True, timeout=600)
    if ingest.returncode:
        raise SystemExit(f"kforge-ingest failed: {ingest.stderr[-2000:]}")
    return read_own(own, rank0), run


@dataclass(frozen=True)
class Side:
    """One side's figures over a range of steps."""

    time_s: float
    tokens_per_s: float
    mfu: float  # fraction


def own_side(log: OwnLog, first: int, tokens_per_step: int) -> Side:
    """KempnerForge's figures over the steps from ``first`` on: Σ of its per-step times, tokens/s and MFU
    time-weighted (Σtokens / Σtime; its MFU is linear in tokens/s)."""
    sel = [(t, mfu) for s, t, mfu in zip(log.steps, log.step_time_s, log.mfu) if s >= first]
    t = sum(x for x, _ in sel)
    return Side(t, tokens_per_step * len(sel) / t, sum(x * m for x, m in sel) / t)


def kforge_side(run: Path, steps: list[int]) -> tuple[Side, float]:
    """kforge's figures from steps.parquet over ``steps``; also rank 0's Σ own work (ranks.parquet
    step_time_s: its own start_step -> end_step, KempnerForge's window)."""
    st = pl.read_parquet(run / "ingested" / "steps.parquet").filter(pl.col("step").is_in(steps))
    t = float(st["step_time_s"].sum())
    mfu = float((st["mfu"] * st["step_time_s"]).sum()) / t  # time-weighted, as summary.json mean_mfu
    r0 = pl.read_parquet(run / "ingested" / "ranks.parquet").filter((pl.col("rank") == 0) & pl.col("step").is_in(steps))
    return Side(t, float(st["tokens"].sum()) / t, mfu), float(r0["step_time_s"].sum())


def per_step(run: Path, log: OwnLog) -> tuple[list[float], list[float]]:
    """Sorted per-step ratios from the 2nd step on: kforge's job step time, and its rank-0 own work, over
    KempnerForge's step_time_sec."""
    st = pl.read_parquet(run / "ingested" / "steps.parquet").filter(pl.col("step") > 1)
    r0 = pl.read_parquet(run / "ingested" / "ranks.parquet").filter((pl.col("rank") == 0) & (pl.col("step") > 1))
    own = dict(zip(log.steps, log.step_time_s))
    return tuple(sorted(v / own[s] for s, v in zip(f["step"].to_list(), f["step_time_s"].to_list()) if s in own)
                 for f in (st, r0))


def loss_check(run: Path, log: OwnLog) -> tuple[int, int, int]:
    """(equal to its logged float, equal to its printed text, compared): rank 0's recorded loss, step by step."""
    r0 = pl.read_parquet(run / "ingested" / "ranks.parquet").filter(pl.col("rank") == 0).select("step", "loss")
    ours = dict(zip(r0["step"].to_list(), r0["loss"].to_list()))
    exact = sum(1 for s, v in zip(log.steps, log.loss) if ours.get(s) == v)
    printed = sum(1 for s, text in log.printed_loss.items() if s in ours and f"{ours[s]:.4f}" == text)
    return exact, printed, len(log.steps)


def rank0_span(run: Path) -> float:
    """(s) rank 0's first start_step to its last end_step, as kforge recorded them."""
    r0 = pl.read_parquet(run / "ingested" / "ranks.parquet").filter(pl.col("rank") == 0).sort("step")
    return float(r0["time"][-1] - (r0["time"][0] - r0["step_time_s"][0]))


def start_end_skew(run: Path) -> tuple[float, float]:
    """(s, s): the first rank's first start minus rank 0's, and the ranks' mean last end minus rank 0's (one host,
    one clock)."""
    r = pl.read_parquet(run / "ingested" / "ranks.parquet").filter(pl.col("step_time_s").is_not_null())
    per = r.group_by("rank").agg((pl.col("time") - pl.col("step_time_s")).min().alias("start"), pl.col("time").max().alias("end"))
    r0 = per.filter(pl.col("rank") == 0)
    return float(per["start"].min() - r0["start"][0]), float(per["end"].mean() - r0["end"][0])


def findings(run: Path) -> tuple[list[str], list[str]]:
    """(warning or error findings as 'kind: message', ingest warnings) of the run's summary.json."""
    summary = json.loads((run / "ingested" / "summary.json").read_text())
    bad = [f"{f['kind']}: {f['message']}" for f in summary.get("findings", []) if f["severity"] in ("warning", "error")]
    return bad, list(summary.get("warnings", []))


def row(label: str, own: Side, kf: Side, work0: float) -> list[str]:
    return [label, f"{own.time_s:.3f}", f"{kf.time_s:.3f}", f"{kf.time_s / own.time_s:.4f}",
            f"{own.tokens_per_s:,.0f}", f"{kf.tokens_per_s:,.0f}", f"{kf.tokens_per_s / own.tokens_per_s:.4f}",
            f"{own.mfu * 100:#.4g}", f"{kf.mfu * 100:#.4g}", f"{kf.mfu / own.mfu:.4f}", f"{work0 / own.time_s:.4f}"]


LABELS = {"all": 1, "from 2": 2, "from 6": 6}
HEAD = ["run / steps", "KF Σ step_time s", "kforge training s", "× time", "KF tok/s", "kforge tok/s", "× tok/s",
        "KF MFU %", "kforge MFU %", "× MFU", "kforge rank-0 Σ work ×"]


def one_run(kf: Path, work: Path, args: argparse.Namespace, i: int) -> tuple[list[list[str]], dict]:
    log, run = run_once(kf, work / f"run-{i}", args, seed=42 + i)
    tokens_per_step = 4 * 64 * 2 * args.world  # batch x seq_len x grad_accum x dp: KempnerForge's tokens_in_step
    rows, ratios = [], {}
    for label, first in LABELS.items():
        steps = [s for s in log.steps if s >= first]  # the steps KempnerForge logged (log_interval)
        own, (kfs, work0) = own_side(log, first, tokens_per_step), kforge_side(run, steps)
        rows.append(row(f"{i} / {label}", own, kfs, work0))
        ratios[label] = (kfs.time_s / own.time_s, kfs.tokens_per_s / own.tokens_per_s, kfs.mfu / own.mfu,
                         work0 / own.time_s)
    exact, printed, n = loss_check(run, log)
    own_all = own_side(log, 1, tokens_per_step).time_s
    outside = rank0_span(run) - own_all  # what KempnerForge's rank-0 step times leave out
    bad, warnings = findings(run)
    summary = json.loads((run / "ingested" / "summary.json").read_text())
    start, end = start_end_skew(run)
    expected = (own_all + outside - start + end) / own_all  # kforge: the first rank's first start -> the mean last end
    print(f"run {i}: {work / f'run-{i}'}: rank 0's recorded loss equals KempnerForge's logged loss on {exact}/{n} "
          f"steps, its printed loss on {printed}/{len(log.printed_loss)}; FLOPs/token kforge "
          f"{summary.get('flops_per_token'):,.0f} ({summary.get('flops_source')}), peak {summary.get('peak_tflops')} "
          f"({summary.get('peak_source')}); warning/error findings {len(bad)}{': ' + '; '.join(bad) if bad else ''}; "
          f"ingest warnings {len(warnings)}{': ' + '; '.join(warnings) if warnings else ''}", flush=True)
    if args.log_interval == 1:  # every step logged: what the Σs leave out, and what it predicts
        print(f"  rank 0 outside KempnerForge's step windows {outside / n * 1e6:.0f} µs a step ({outside / own_all * 100:.3f} "
              f"% of its Σ step_time), the first rank's first start {start * 1e3:+.1f} ms from rank 0's, their mean last "
              f"end {end * 1e3:+.1f} ms: kforge/KempnerForge time over all steps expected {expected:.4f}, measured "
              f"{ratios['all'][0]:.4f}; the drop-in's calls {log.kforge_calls_s / n * 1e6:.0f} µs a step inside its windows: "
              f"rank 0's Σ own work + them over its Σ step_time {ratios['all'][3] + log.kforge_calls_s / own_all:.4f}")
        for what, v in zip(("the job's step time", "rank 0's own work"), per_step(run, log)):
            print(f"  per step from the 2nd, kforge's {what} / KempnerForge's step_time: median {statistics.median(v):.4f}, "
                  f"5-95 % {v[len(v) // 20]:.4f}-{v[-1 - len(v) // 20]:.4f}")
    return rows, {"ratios": ratios, "residual": ratios["all"][0] / expected - 1, "exact": exact, "printed": printed,
                  "n": n, "n_printed": len(log.printed_loss), "bad": len(bad), "warnings": len(warnings),
                  "fpt": summary.get("flops_per_token")}


def kf_flops_per_token(kf: Path) -> int:
    """KempnerForge's own estimate_model_flops_per_token for the TOML's model."""
    sys.path.insert(0, str(kf))
    try:
        from kempnerforge.config.schema import ModelConfig
        from kempnerforge.metrics.mfu import estimate_model_flops_per_token
    finally:
        sys.path.remove(str(kf))
    return estimate_model_flops_per_token(ModelConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=4, vocab_size=256,
                                                      max_seq_len=64), seq_len=64)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kempnerforge", type=Path, required=True, help="a KempnerForge checkout (scripts/train.py)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=400, help="train.max_steps")
    ap.add_argument("--world", type=int, default=2, help="torchrun --nproc_per_node")
    ap.add_argument("--jitter-ms", type=float, default=6.0, help="each rank sleeps uniform(0, this) ms per step")
    ap.add_argument("--log-interval", type=int, default=1, help="metrics.log_interval (KempnerForge logs these steps)")
    ap.add_argument("--peak-tflops", type=float, default=1.0, help="kforge-ingest --peak-tflops (KempnerForge's CPU: 1.0)")
    ap.add_argument("--keep", type=Path, help="work folder to keep (default: a temp folder, removed)")
    args = ap.parse_args()
    kf = args.kempnerforge.resolve()
    work = args.keep or Path(tempfile.mkdtemp(prefix="kf-kempnerforge-"))
    table, results = [], []
    try:
        for i in range(args.runs):
            rows, res = one_run(kf, work, args, i)
            table += rows
            results.append(res)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    print("\n| " + " | ".join(HEAD) + " |\n|" + " --- |" + " ---: |" * (len(HEAD) - 1))
    for r in table:
        print("| " + " | ".join(r) + " |")
    for label in LABELS:
        med = [statistics.median(r["ratios"][label][k] for r in results) for k in range(4)]
        worst = max(abs(r["ratios"][label][k] - 1) for r in results for k in range(3))
        worst_work = max(abs(r["ratios"][label][3] - 1) for r in results)
        print(f"\n{label}: median kforge/KempnerForge time {med[0]:.4f}, tokens/s {med[1]:.4f}, MFU {med[2]:.4f}; "
              f"largest deviation {worst * 100:.3f} % ({'within' if worst <= 0.005 else 'OUTSIDE'} 0.5 %); "
              f"rank 0's own windows (like with like): median {med[3]:.4f}, largest deviation {worst_work * 100:.3f} %")
    if args.log_interval == 1:
        print(f"all steps, rank 0's time outside KempnerForge's windows and the ranks' first-start/last-end skew taken out: largest "
              f"residual {max(abs(r['residual']) for r in results) * 100:.3f} %")
    print(f"FLOPs/token: KempnerForge's estimate_model_flops_per_token {kf_flops_per_token(kf):,}, "
          f"kforge's {sorted({r['fpt'] for r in results})}")
    print(f"loss: rank 0's recorded loss equals KempnerForge's logged float on {sum(r['exact'] for r in results)}/"
          f"{sum(r['n'] for r in results)} steps and its printed line on {sum(r['printed'] for r in results)}/"
          f"{sum(r['n_printed'] for r in results)}")
    print(f"kforge warning/error findings over the clean runs: {sum(r['bad'] for r in results)}; "
          f"ingest warnings: {sum(r['warnings'] for r in results)}")


if __name__ == "__main__":
    main()
