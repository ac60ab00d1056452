#!/usr/bin/env python
"""kforge's training time, tokens/s, MFU and loss side by side with nanoGPT's own figures, on real
2-rank gloo DDP runs on CPU with per-rank jitter (issue 27, point 1).

    python benchmarks/side_by_side_nanogpt.py --nanogpt PATH [--runs 3] [--iters 400] [--jitter-ms 6]

PATH is a nanoGPT checkout (github.com/karpathy/nanoGPT; nothing of it is copied into this repo).
Per run, in a temp folder: synthetic token data (train.bin/val.bin of random uint16 tokens, meta.pkl
with a small vocab: no network for prepare.py); nanoGPT's train.py copied beside its model.py and
configurator.py, with kforge's lines inserted as docs/recording.md tells a user (import, Recorder
with the model description and nanoGPT's peak, start_step, end_step, close) and three harness
edits (CPU under DDP: device and device_ids; a random sleep in get_batch per rank, own seed, own
RNG: KFORGE_JITTER_MS), each applied by exact text substitution that must match once; the maths
is untouched. Then `torchrun --nproc_per_node=2` (gloo, cpu, float32, compile=False), rank 0's own
log lines `iter N: loss X, time Yms, mfu Z%` are parsed, and `kforge-ingest` reads the run.

nanoGPT's printed mfu is a running EMA (from the 6th iteration on) of per-iteration estimates: the
comparison is against nanoGPT's Σdt-based figures from its own printed dt values: tokens/s =
tokens_per_iter (its own print) x iterations / Σdt, MFU = its own GPT.estimate_mfu(batch_size x
gradient_accumulation_steps x iterations, Σdt) (6N + 12·L·H·Q·T per token, 312 TFLOPS). kforge
gets the same FLOPs through Recorder(model=dict(n_params=N, n_layers=L, dim=H·Q, seq_len=T)) and
Recorder(peak_tflops=312): 6·N + 12·L·D·S is the same formula.

Rows per run: all iterations, from the 2nd (the ranks in step after the first all-reduce), from
the 6th (where nanoGPT's EMA starts). Over all iterations the two differ by the ranks' start skew
(nanoGPT's Σdt is rank 0's clock from its first iteration; kforge's training time runs from the
first rank's first start to the ranks' last ends, docs/CONTRACT.md): each run prints the ratio that skew predicts beside
the measured one. The last column is the step time kforge used before issue 27 (Σ of each step's
slowest own start_step->end_step) over nanoGPT's Σdt. Figures: docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

ROOT = Path(__file__).resolve().parent.parent
VOCAB = 96
CONFIG = dict(n_layer=2, n_head=4, n_embd=64, block_size=64, batch_size=8, gradient_accumulation_steps=2,
              bias=False, dropout=0.0)
LINE = re.compile(r"^iter (\d+): loss (\S+), time ([\d.]+)ms, mfu (-?[\d.]+)%$")
TOKENS_LINE = re.compile(r"^tokens per iteration will be: ([\d,]+)$")

# (what, old text, new text): each old text must occur exactly once in nanoGPT's train.py.
PATCHES = (
    ("kforge import", "from model import GPTConfig, GPT\n",
     "from model import GPTConfig, GPT\nfrom kforge_record import Recorder  # kforge\n"
     "import random as _kf_random  # harness: jitter\n"),
    ("harness: CPU under DDP (device)", "    device = f'cuda:{ddp_local_rank}'\n    torch.cuda.set_device(device)\n",
     "    if device.startswith('cuda'):  # harness: CPU under DDP (gloo)\n"
     "        device = f'cuda:{ddp_local_rank}'\n        torch.cuda.set_device(device)\n"),
    ("harness: CPU under DDP (device_ids)", "model = DDP(model, device_ids=[ddp_local_rank])\n",
     "model = DDP(model, device_ids=[ddp_local_rank] if device_type == 'cuda' else None)  # harness: CPU\n"),
    ("harness: per-rank jitter", "def get_batch(split):\n",
     "_kf_jitter_ms = float(os.environ.get('KFORGE_JITTER_MS', '0'))  # harness: per-rank jitter\n"
     "_kf_rng = _kf_random.Random(1000 + seed_offset)  # its own RNG: torch's (the data) is untouched\n"
     "def get_batch(split):\n"
     "    if _kf_jitter_ms: time.sleep(_kf_rng.uniform(0, _kf_jitter_ms) / 1000)  # harness\n"),
    ("kforge Recorder", "# training loop\n",
     "_kf_raw = model.module if ddp else model  # kforge: nanoGPT's estimate_mfu FLOPs and peak\n"
     "rec = Recorder(os.environ['KFORGE_RUN'], peak_tflops=312, hparams=config,\n"
     "               model=dict(n_params=_kf_raw.get_num_params(), n_layers=_kf_raw.config.n_layer,\n"
     "                          dim=_kf_raw.config.n_embd, seq_len=_kf_raw.config.block_size))\n"
     "# training loop\n"),
    ("kforge start_step", "while True:\n", "while True:\n    rec.start_step()  # kforge\n"),
    ("kforge end_step", "    optimizer.zero_grad(set_to_none=True)\n",
     "    optimizer.zero_grad(set_to_none=True)\n"
     "    rec.end_step(iter_num, loss=loss.detach() * gradient_accumulation_steps, lr=lr,  # kforge\n"
     "                 tokens=batch_size * block_size * gradient_accumulation_steps)\n"),
    ("kforge close", "if ddp:\n    destroy_process_group()\n", "rec.close()  # kforge\nif ddp:\n    destroy_process_group()\n"),
)


def patched_train_py(source: str) -> str:
    """nanoGPT's train.py with the PATCHES applied; a ValueError names a patch whose text is not there once."""
    for what, old, new in PATCHES:
        n = source.count(old)
        if n != 1:
            raise ValueError(f"train.py: the text for '{what}' occurs {n} times, not once (another nanoGPT version?)")
        source = source.replace(old, new)
    return source


def write_data(data_dir: Path, seed: int) -> None:
    """Random uint16 tokens below VOCAB and meta.pkl, as nanoGPT's char-level prepare.py writes them."""
    data_dir.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    for name, n in (("train.bin", 200_000), ("val.bin", 20_000)):
        rng.integers(0, VOCAB, n, dtype=np.uint16).tofile(data_dir / name)
    with open(data_dir / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": VOCAB}, f)


@dataclass(frozen=True)
class NanoLog:
    """rank 0's own log: per iteration its printed loss (the text), dt (s) and running mfu (%)."""

    tokens_per_iter: int
    iters: list[int]
    loss_text: list[str]
    dt_s: list[float]
    mfu_ema_pct: list[float]


def parse_log(text: str) -> NanoLog:
    tokens_per_iter, iters, loss, dt, mfu = None, [], [], [], []
    for line in text.splitlines():
        if m := TOKENS_LINE.match(line.strip()):
            tokens_per_iter = int(m.group(1).replace(",", ""))
        elif m := LINE.match(line.strip()):
            iters.append(int(m.group(1)))
            loss.append(m.group(2))
            dt.append(float(m.group(3)) / 1000)
            mfu.append(float(m.group(4)))
    if tokens_per_iter is None or not iters:
        raise SystemExit(f"no nanoGPT log lines found in rank 0's stdout:\n{text[-2000:]}")
    return NanoLog(tokens_per_iter, iters, loss, dt, mfu)


def run_once(nanogpt: Path, work: Path, args: argparse.Namespace, seed: int) -> tuple[NanoLog, Path]:
    """One torchrun of the patched train.py in ``work``; rank 0's log and the kforge run folder."""
    work.mkdir(parents=True)
    for name in ("model.py", "configurator.py"):
        shutil.copy(nanogpt / name, work / name)
    (work / "train.py").write_text(patched_train_py((nanogpt / "train.py").read_text()))
    write_data(work / "data" / "synthetic", seed)
    run = work / "kforge-run"
    overrides = dict(CONFIG, dataset="synthetic", out_dir=str(work / "out"), device="cpu", dtype="float32",
                     compile=False, backend="gloo", max_iters=args.iters, eval_interval=10**9, eval_iters=2,
                     log_interval=1, decay_lr=False, always_save_checkpoint=False)
    logs = work / "torchrun-logs"  # each rank's stdout in a file of its own: block-buffered ranks sharing a pipe interleave
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.world}",
           f"--log-dir={logs}", "--redirects=3", "train.py",
           *(f"--{k}={v}" for k, v in overrides.items())]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "KFORGE_RUN": str(run), "KFORGE_JITTER_MS": str(args.jitter_ms),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=1800)
    rank0 = [p.read_text() for p in sorted(logs.glob("*/attempt_0/0/stdout.log"))]
    (work / "nanogpt.log").write_text("".join(rank0))
    if proc.returncode or len(rank0) != 1:
        errs = "".join(p.read_text()[-2000:] for p in sorted(logs.glob("*/attempt_0/*/stderr.log")))
        raise SystemExit(f"torchrun failed ({proc.returncode}, {len(rank0)} rank-0 logs)\n{proc.stderr[-2000:]}\n{errs}")
    ingest = subprocess.run([sys.executable, "-m", "kforge_dash.cli.ingest", str(run), "--no-tensorboard", "--quiet"],
                            env=env, capture_output=True, text=True, timeout=600)
    if ingest.returncode:
        raise SystemExit(f"kforge-ingest failed: {ingest.stderr[-2000:]}")
    return parse_log(rank0[0]), run


def nanogpt_mfu(nanogpt: Path, fwdbwd: int, dt: float) -> tuple[float, int]:
    """nanoGPT's own GPT.estimate_mfu for ``fwdbwd`` sequences in ``dt`` seconds, and its N (non-embedding)."""
    sys.path.insert(0, str(nanogpt))
    try:
        from model import GPT, GPTConfig
    finally:
        sys.path.remove(str(nanogpt))
    keys = ("n_layer", "n_head", "n_embd", "block_size", "bias", "dropout")
    gpt = GPT(GPTConfig(vocab_size=VOCAB, **{k: CONFIG[k] for k in keys}))
    return gpt.estimate_mfu(fwdbwd, dt), gpt.get_num_params()


@dataclass(frozen=True)
class Side:
    """One side's figures over a range of iterations."""

    time_s: float
    tokens_per_s: float
    mfu: float  # fraction


def nanogpt_side(nanogpt: Path, log: NanoLog, first: int, world: int) -> Side:
    """nanoGPT's Σdt-based figures over the iterations from ``first`` on, from its printed dt."""
    dts = [dt for it, dt in zip(log.iters, log.dt_s) if it >= first]
    n, sdt = len(dts), sum(dts)
    per_rank_seqs = CONFIG["batch_size"] * CONFIG["gradient_accumulation_steps"] // world  # fwdbwd_per_iter
    mfu, _ = nanogpt_mfu(nanogpt, per_rank_seqs * n, sdt)
    return Side(sdt, log.tokens_per_iter * n / sdt, mfu)


def kforge_side(run: Path, first: int) -> tuple[Side, float]:
    """kforge's figures from steps.parquet over the steps from ``first`` on; also the old contract's
    training time there (Σ of each step's slowest own start_step->end_step time, before issue 27)."""
    st = pl.read_parquet(run / "ingested" / "steps.parquet").filter(pl.col("step") >= first)
    t = float(st["step_time_s"].sum())
    mfu = float((st["mfu"] * st["step_time_s"]).sum()) / t  # time-weighted, as summary.json mean_mfu
    return Side(t, float(st["tokens"].sum()) / t, mfu), float(st["step_work_s"].sum())


def start_end_skew(run: Path) -> tuple[float, float]:
    """(s, s): the first rank's first start minus rank 0's, and the ranks' mean last end minus rank 0's (one host,
    one clock)."""
    r = pl.read_parquet(run / "ingested" / "ranks.parquet").filter(pl.col("step_time_s").is_not_null())
    per = r.group_by("rank").agg((pl.col("time") - pl.col("step_time_s")).min().alias("start"), pl.col("time").max().alias("end"))
    r0 = per.filter(pl.col("rank") == 0)
    return float(per["start"].min() - r0["start"][0]), float(per["end"].mean() - r0["end"][0])


def loss_check(run: Path, log: NanoLog) -> tuple[int, int]:
    """(equal, compared): rank 0's recorded loss printed as nanoGPT prints it, step by step."""
    r0 = pl.read_parquet(run / "ingested" / "ranks.parquet").filter(pl.col("rank") == 0).select("step", "loss")
    ours = dict(zip(r0["step"].to_list(), r0["loss"].to_list()))
    equal = sum(1 for it, text in zip(log.iters, log.loss_text) if it in ours and f"{ours[it]:.4f}" == text)
    return equal, len(log.iters)


def row(label: str, nano: Side, kf: Side, old_s: float) -> list[str]:
    return [label, f"{nano.time_s:.3f}", f"{kf.time_s:.3f}", f"{kf.time_s / nano.time_s:.4f}",
            f"{nano.tokens_per_s:,.0f}", f"{kf.tokens_per_s:,.0f}", f"{kf.tokens_per_s / nano.tokens_per_s:.4f}",
            f"{nano.mfu * 100:#.4g}", f"{kf.mfu * 100:#.4g}", f"{kf.mfu / nano.mfu:.4f}", f"{old_s / nano.time_s:.4f}"]


# all iterations; from the 2nd (the ranks in step after the first all-reduce); from the 6th (where
# nanoGPT's running mfu starts)
LABELS = {"all": 0, "from 1": 1, "from 5": 5}
HEAD = ["run / iterations", "nanoGPT Σdt s", "kforge training s", "× time", "nanoGPT tok/s", "kforge tok/s", "× tok/s",
        "nanoGPT MFU %", "kforge MFU %", "× MFU", "old Σmax work ×"]


def one_run(nanogpt: Path, work: Path, args: argparse.Namespace, i: int) -> tuple[list[list[str]], dict]:
    log, run = run_once(nanogpt, work / f"run-{i}", args, seed=i)
    summary = json.loads((run / "ingested" / "summary.json").read_text())
    rows, ratios = [], {}
    for label, first in LABELS.items():
        nano, (kf, old) = nanogpt_side(nanogpt, log, first, args.world), kforge_side(run, first)
        rows.append(row(f"{i} / {label}", nano, kf, old))
        ratios[label] = (kf.time_s / nano.time_s, kf.tokens_per_s / nano.tokens_per_s, kf.mfu / nano.mfu)
    equal, n = loss_check(run, log)
    start, end = start_end_skew(run)
    nano_all = sum(log.dt_s)
    explained = (nano_all - start + end) / nano_all  # kforge's sum: the first rank's first start -> the ranks' mean last end
    _, n_params = nanogpt_mfu(nanogpt, 1, 1.0)
    model = json.loads(next(run.glob("rank-00000/*/meta.json")).read_text())["model"]
    print(f"run {i}: {work / f'run-{i}'}: rank 0's loss equals nanoGPT's print on {equal}/{n} iterations; "
          f"summary.json wall_time_s {summary['wall_time_s']:.3f}, mean_tokens_per_sec {summary['mean_tokens_per_sec']:,.0f}, "
          f"mean_mfu {summary['mean_mfu'] * 100:.4g} %; nanoGPT's last printed running mfu {log.mfu_ema_pct[-1]:.2f} %; "
          f"N: nanoGPT {n_params:,}, kforge recorded {model.get('n_params'):,}; the first rank's first start "
          f"{start * 1e3:+.1f} ms from rank 0's, their mean last end {end * 1e3:+.1f} ms: "
          f"kforge/nanoGPT time over all iterations expected {explained:.4f}, measured {ratios['all'][0]:.4f}", flush=True)
    return rows, {"ratios": ratios, "loss_equal": equal, "loss_n": n, "residual": ratios["all"][0] / explained - 1}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nanogpt", type=Path, required=True, help="a nanoGPT checkout (train.py, model.py, configurator.py)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--iters", type=int, default=400, help="nanoGPT max_iters (iterations 0..max_iters run)")
    ap.add_argument("--world", type=int, default=2, help="torchrun --nproc_per_node")
    ap.add_argument("--jitter-ms", type=float, default=6.0, help="each rank sleeps uniform(0, this) ms per get_batch")
    ap.add_argument("--keep", type=Path, help="work folder to keep (default: a temp folder, removed)")
    args = ap.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="kf-nanogpt-"))
    table, results = [], []
    try:
        for i in range(args.runs):
            rows, res = one_run(args.nanogpt.resolve(), work, args, i)
            table += rows
            results.append(res)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    print("\n| " + " | ".join(HEAD) + " |\n|" + " --- |" + " ---: |" * (len(HEAD) - 1))
    for r in table:
        print("| " + " | ".join(r) + " |")
    for label in LABELS:
        med = [statistics.median(r["ratios"][label][k] for r in results) for k in range(3)]
        worst = max(abs(r["ratios"][label][k] - 1) for r in results for k in range(3))
        print(f"\n{label}: median kforge/nanoGPT time {med[0]:.4f}, tokens/s {med[1]:.4f}, MFU {med[2]:.4f}; "
              f"largest deviation {worst * 100:.3f} % ({'within' if worst <= 0.005 else 'OUTSIDE'} 0.5 %)")
    print(f"all iterations, the ranks' first-start/last-end skew taken out: largest residual "
          f"{max(abs(r['residual']) for r in results) * 100:.3f} %")
    print(f"loss: rank 0's recorded loss equals nanoGPT's printed loss on "
          f"{sum(r['loss_equal'] for r in results)}/{sum(r['loss_n'] for r in results)} logged iterations")


if __name__ == "__main__":
    main()
