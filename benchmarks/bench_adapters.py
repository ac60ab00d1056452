#!/usr/bin/env python
"""What each framework adapter costs per training step, next to that framework's own logging.

Each contender is driven through the calls its framework makes in one optimizer step (the hooks
called directly, with the framework's real argument objects), so the figure is the adapter's own
host time per step, without the model:

  hf        KforgeCallback: on_step_begin, on_pre_optimizer_step, on_optimizer_step, on_step_end, on_log
  hf-tb     transformers' TensorBoardCallback.on_log (what report_to="tensorboard" adds per logged step)
  pl        KforgeCallback: on_train_batch_start, on_before_optimizer_step, on_train_batch_end, + cb.logger.log_metrics
  pl-csv    Lightning's CSVLogger.log_metrics + save (its default logger, every step)
  pl-tb     Lightning's TensorBoardLogger.log_metrics
  acc       KforgeTracker.log (accelerator.log's call)
  acc-tb    Accelerate's TensorBoardTracker.log
  kf        kempnerforge.MetricsTracker.start_step + end_step

    python benchmarks/bench_adapters.py           # README figures (~1 min)
    python benchmarks/bench_adapters.py --quick

Contenders run interleaved within each repeat; every figure is a median over the repeats.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import warnings
from time import perf_counter

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
warnings.filterwarnings("ignore")
os.environ.setdefault("WANDB_MODE", "offline")

import torch  # noqa: E402

LOGS = {"loss": 2.5, "grad_norm": 0.8, "learning_rate": 3e-4, "epoch": 0.1}


def _hf(tmp):
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from kforge_record.integrations.hf import KforgeCallback

    args = TrainingArguments(output_dir=tmp, report_to="none", use_cpu=True, logging_steps=1)
    state, control = TrainerState(), TrainerControl()
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=3e-4)
    cb = KforgeCallback(os.path.join(tmp, "hf"), install_sigterm_handler=False)
    cb.on_train_begin(args, state, control, model=None)

    def step():
        cb.on_step_begin(args, state, control)
        cb.on_pre_optimizer_step(args, state, control)
        cb.on_optimizer_step(args, state, control, optimizer=opt)
        state.global_step += 1
        cb.on_step_end(args, state, control)
        cb.on_log(args, state, control, logs=dict(LOGS))

    return step, lambda: cb.on_train_end(args, state, control)


def _hf_tb(tmp):
    from transformers import TrainerControl, TrainerState, TrainingArguments
    from transformers.integrations import TensorBoardCallback

    args = TrainingArguments(output_dir=tmp, report_to="none", use_cpu=True)
    state, control = TrainerState(), TrainerControl()
    state.is_world_process_zero = True
    cb = TensorBoardCallback()
    cb.on_train_begin(args, state, control)

    def step():
        state.global_step += 1
        cb.on_log(args, state, control, logs=dict(LOGS))

    return step, lambda: cb.on_train_end(args, state, control)


class _FakeTrainer:
    def __init__(self):
        self.global_step, self.global_rank, self.world_size, self.local_rank = 0, 0, 1, 0
        self.callback_metrics = {}


def _pl(tmp):
    from kforge_record.integrations.lightning import KforgeCallback

    cb = KforgeCallback(os.path.join(tmp, "pl"), install_sigterm_handler=False)
    trainer, module = _FakeTrainer(), torch.nn.Module()
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=3e-4)
    batch, loss = torch.zeros(4, 16, dtype=torch.long), torch.tensor(2.5)
    cb.on_train_start(trainer, module)
    logger = cb.logger

    def step():
        cb.on_train_batch_start(trainer, module, batch, 0)
        cb.on_before_optimizer_step(trainer, module, opt)
        trainer.global_step += 1
        cb.on_train_batch_end(trainer, module, {"loss": loss}, batch, 0)
        logger.log_metrics({"train_loss": 2.5, "epoch": 0}, step=trainer.global_step - 1)

    return step, lambda: cb.on_train_end(trainer, module)


def _pl_logger(kind):
    def make(tmp):
        from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

        logger = (CSVLogger if kind == "csv" else TensorBoardLogger)(tmp, name=kind)
        n = [0]

        def step():
            n[0] += 1
            logger.log_metrics({"train_loss": 2.5, "epoch": 0}, step=n[0])
            logger.save()

        return step, lambda: logger.finalize("success")
    return make


def _acc(tmp):
    from kforge_record.integrations.accelerate import KforgeTracker

    tr = KforgeTracker(os.path.join(tmp, "acc"), install_sigterm_handler=False, rank=0, world_size=1)
    n = [0]

    def step():
        n[0] += 1
        tr.log({"loss": 2.5, "lr": 3e-4, "tokens": 4096}, step=n[0])

    return step, tr.finish


def _acc_tb(tmp):
    from accelerate.tracking import TensorBoardTracker

    tr = TensorBoardTracker("bench", tmp)
    tr.start()
    n = [0]

    def step():
        n[0] += 1
        tr.log({"loss": 2.5, "lr": 3e-4, "tokens": 4096}, step=n[0])

    return step, tr.finish


def _kf(tmp):
    from kforge_record.integrations.kempnerforge import MetricsTracker

    t = MetricsTracker(None, run_dir=os.path.join(tmp, "kf"), install_sigterm_handler=False)
    loss = torch.tensor(2.5)
    n = [0]

    def step():
        n[0] += 1
        t.start_step()
        t.end_step(n[0], loss, 0.8, 3e-4, 4096)

    return step, t.close


CONTENDERS = {"hf": _hf, "hf-tb": _hf_tb, "pl": _pl, "pl-csv": _pl_logger("csv"), "pl-tb": _pl_logger("tb"),
              "acc": _acc, "acc-tb": _acc_tb, "kf": _kf}


def time_one(make, steps: int) -> float:
    tmp = tempfile.mkdtemp(prefix="kforge-bench-adapters-")
    try:
        step, close = make(tmp)
        for _ in range(50):
            step()  # warm up (first-call imports, lazy writers)
        t0 = perf_counter()
        for _ in range(steps):
            step()
        dt = perf_counter() - t0
        close()
        return dt / steps * 1e6
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--quick", action="store_true")
    a = p.parse_args()
    steps, repeat = (300, 2) if a.quick else (a.steps, a.repeat)
    got = {k: [] for k in CONTENDERS}
    names = list(CONTENDERS)
    for i in range(repeat):
        for k in names[i % len(names):] + names[:i % len(names)]:  # rotating order
            got[k].append(time_one(CONTENDERS[k], steps))
    med = {k: statistics.median(v) for k, v in got.items()}
    print(f"{steps} steps x {repeat} repeats, medians, µs per step (host time of the hook calls only)\n")
    print("| framework | kforge adapter | µs/step | framework's own logging | µs/step | ratio |")
    print("| --- | --- | ---: | --- | ---: | ---: |")
    rows = [("HF Trainer", "hf", "TensorBoardCallback.on_log", "hf-tb"),
            ("Lightning", "pl", "CSVLogger.log_metrics + save", "pl-csv"),
            ("Lightning", "pl", "TensorBoardLogger.log_metrics + save", "pl-tb"),
            ("Accelerate", "acc", "TensorBoardTracker.log", "acc-tb")]
    for fw, ours, theirs_name, theirs in rows:
        print(f"| {fw} | {ours} | {med[ours]:.1f} | {theirs_name} | {med[theirs]:.1f} | {med[ours] / med[theirs]:.2f} |")
    print(f"| KempnerForge shape | kf | {med['kf']:.1f} | (original not installed) | | |")


if __name__ == "__main__":
    main()
