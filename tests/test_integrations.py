"""Each framework adapter, run for real on a tiny randomly initialised model (CPU, no download), its
ingested steps checked against the framework's own record of the same run."""

from __future__ import annotations

import csv
import dataclasses
import glob
import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
import torch

from kforge_dash import ingest_run

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples"))


def _steps(run) -> pl.DataFrame:
    return pl.read_parquet(os.path.join(run, "ingested", "steps.parquet"))


def _meta(run) -> dict:
    return json.load(open(glob.glob(os.path.join(run, "rank-00000", "*", "meta.json"))[0]))


def test_hf_trainer_steps_match_its_log_history(tmp_path):
    import train_hf

    run, lh = str(tmp_path / "hf"), str(tmp_path / "log_history.json")
    train_hf.main(["--run-dir", run, "--steps", "12", "--grad-accum", "2", "--eval-steps", "5", "--log-history", lh])
    res = ingest_run(run)
    hist = json.load(open(lh))
    df = _steps(run)
    assert df["step"].to_list() == list(range(1, 13))  # state.global_step after the step: 1 for the first
    train = [h for h in hist if "loss" in h]
    assert [h["step"] for h in train] == list(range(1, 13))
    by_step = {r["step"]: r for r in df.iter_rows(named=True)}
    for h in train:
        r = by_step[h["step"]]
        assert r["loss"] == h["loss"] and r["grad_norm"] == h["grad_norm"] and r["lr"] == h["learning_rate"], h
        assert r["hf/epoch"] == h["epoch"]
    evals = {h["step"]: h["eval_loss"] for h in hist if "eval_loss" in h}
    assert evals.keys() == {5, 10, 12}
    assert {r["step"]: r["eval/loss"] for r in df.iter_rows(named=True) if r["eval/loss"] is not None} == evals
    # tokens: the Trainer's own count, per step (batch 4 x 16 ids x 2 micro-batches)
    assert df["tokens"].to_list() == [128] * 12 and res.summary["tokens"] == hist[-1]["num_input_tokens_seen"]
    assert all(df[c].drop_nulls().len() == 12 for c in ("time/data_s", "time/fwd_bwd_s", "time/optimizer_s"))
    assert (df["time/fwd_bwd_s"] + df["time/optimizer_s"] <= df["step_time_s"]).all()
    meta = _meta(run)
    assert meta["hparams"]["gradient_accumulation_steps"] == 2 and meta["hparams"]["model_config"]["hidden_size"] == 32
    assert meta["model"]["n_layers"] == 2 and meta["model"]["dim"] == 32 and meta["model"]["seq_len"] == 16
    assert res.summary["flops_per_token"] > 0
    assert not [w for w in res.summary["warnings"] if "logged" in w or "given by both" in w]


@pytest.mark.slow
def test_hf_trainer_two_processes_record_every_rank(tmp_path):
    run, lh = str(tmp_path / "hf2"), str(tmp_path / "lh.json")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(REPO / "examples" / "train_hf.py"), "--run-dir", run, "--steps", "6", "--eval-steps", "3",
           "--log-history", lh]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = ingest_run(run)
    hist = [h for h in json.load(open(lh)) if "loss" in h]
    df = _steps(run)
    assert res.summary["world_size"] == 2 and df["n_ranks"].to_list() == [2] * 6
    assert df["loss"].to_list() == [h["loss"] for h in hist]  # the Trainer's loss is already averaged over ranks
    assert df["lr"].to_list() == [h["learning_rate"] for h in hist]
    # num_input_tokens_seen is summed over processes: counted once (rank 0), not twice
    assert res.summary["tokens"] == json.load(open(lh))[-1]["num_input_tokens_seen"] == 6 * 2 * 64


def _csv_rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_lightning_steps_match_its_csv_logger(tmp_path):
    import train_lightning

    run = str(tmp_path / "pl")
    metrics_csv = train_lightning.main(["--run-dir", run, "--steps", "10", "--val-every", "5"])
    res = ingest_run(run)
    df = _steps(run)
    assert df["step"].to_list() == list(range(1, 11))
    rows = _csv_rows(metrics_csv)
    # Lightning's loggers number a training step by the optimizer steps before it (0 first); kforge
    # by trainer.global_step after it (1 first), like the HF Trainer: kforge step = csv step + 1.
    train = {int(r["step"]) + 1: float(r["train_loss"]) for r in rows if r["train_loss"]}
    val = {int(r["step"]) + 1: float(r["val_loss"]) for r in rows if r["val_loss"]}
    assert sorted(train) == list(range(1, 11)) and sorted(val) == [5, 10]
    for r in df.iter_rows(named=True):
        assert r["loss"] == pytest.approx(train[r["step"]], rel=1e-6)  # training_step's output
        assert r["train_loss"] == pytest.approx(train[r["step"]], rel=1e-6)  # through cb.logger
        assert r["lr"] == pytest.approx(1e-2 / r["step"])  # LambdaLR 1/(1+s) before the step's update
        assert r["tokens"] == 4 * 16
    assert {r["step"]: r["val_loss"] for r in df.iter_rows(named=True) if r["val_loss"] is not None} == pytest.approx(val)
    assert _meta(run)["hparams"] == {"lr": 0.01, "seq_len": 16}
    assert res.summary["tokens"] == 10 * 64


def test_lightning_gradient_accumulation_records_the_mean_micro_batch_loss(tmp_path):
    import train_lightning

    run = str(tmp_path / "pl-acc")
    train_lightning.main(["--run-dir", run, "--steps", "4", "--grad-accum", "2", "--val-every", "8"])
    ingest_run(run)
    df = _steps(run)
    assert df["step"].to_list() == [1, 2, 3, 4] and df["tokens"].to_list() == [128] * 4
    # Recompute the micro-batch losses independently: same seed, same data, same model.
    torch.manual_seed(0)
    import lightning.pytorch as L

    L.seed_everything(0, verbose=False)
    g = torch.Generator().manual_seed(1)
    data = torch.randint(0, train_lightning.VOCAB, (4 * 2 * 4, 16), generator=g)
    model = train_lightning.TinyLM(seq_len=16)
    with torch.no_grad():
        first = (model._loss(data[0:4]) + model._loss(data[4:8])) / 2
    assert df["loss"][0] == pytest.approx(first.item(), rel=1e-6)


def test_accelerate_tracker_records_what_accelerator_log_gets(tmp_path):
    from accelerate import Accelerator

    from kforge_record.integrations.accelerate import KforgeTracker

    run = str(tmp_path / "acc")
    tracker = KforgeTracker(run, tags=["acc"])
    acc = Accelerator(cpu=True, log_with=tracker)
    acc.init_trackers("proj", config={"lr": 0.1, "batch": 8})
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    x, y = torch.randn(8, 4, generator=torch.Generator().manual_seed(0)), torch.zeros(8, 1)
    logged = []
    for step in range(1, 6):
        with tracker.phase("fwd_bwd"):
            loss = torch.nn.functional.mse_loss(model(x), y)
            acc.backward(loss)
        opt.step()
        opt.zero_grad()
        vals = {"loss": loss.item(), "learning_rate": 0.1, "tokens": 8, "accuracy": 0.5 + step / 100}
        logged.append(vals)
        acc.log(vals, step=step)
    acc.log({"eval_loss": 0.25}, step=5)  # a second call for the same step fills it
    acc.end_training()
    res = ingest_run(run)
    df = _steps(run)
    assert df["step"].to_list() == [1, 2, 3, 4, 5]
    assert df["loss"].to_list() == [v["loss"] for v in logged] and df["lr"].to_list() == [0.1] * 5
    assert df["accuracy"].to_list() == [v["accuracy"] for v in logged] and df["eval_loss"].to_list()[-1] == 0.25
    assert df["tokens"].to_list() == [8] * 5 and df["time/fwd_bwd_s"].drop_nulls().len() == 5
    assert _meta(run)["hparams"] == {"lr": 0.1, "batch": 8} and res.summary["tags"] == ["acc"]


@dataclasses.dataclass
class _Model:
    n_layers: int = 2
    dim: int = 64
    n_heads: int = 4
    n_kv_heads: int = 2
    ffn_hidden_dim: int = 128
    vocab_size: int = 100


@dataclasses.dataclass
class _Train:
    seq_len: int = 32


@dataclasses.dataclass
class _Config:
    model: _Model = dataclasses.field(default_factory=_Model)
    train: _Train = dataclasses.field(default_factory=_Train)


# Microsecond steps at a 100 TFLOPS peak may do more FLOPs than the peak allows (then: no MFU
# waterfall, with a warning); whether they do depends on the machine's speed, so it is not asserted.
@pytest.mark.filterwarnings("ignore:mfu_waterfall")
def test_kempnerforge_tracker_call_shape(tmp_path):
    from kforge_record.integrations.kempnerforge import MetricsTracker

    run = str(tmp_path / "kf")
    # Without KempnerForge installed the drop-in records all the same, says so once, returns None.
    with pytest.warns(RuntimeWarning, match="KempnerForge's metrics modules cannot be imported"):
        tracker = MetricsTracker(_Config(), num_gpus=1, gpu_peak_tflops=100.0, run_dir=run)
        for step in range(1, 6):
            tracker.start_step()
            loss = torch.tensor(3.0 - step / 10)
            assert tracker.end_step(step, loss, 1.5, 3e-4, 4096) is None
    tracker.log_eval({"eval/loss": 2.5}, step=5)
    tracker.close()
    res = ingest_run(run)
    df = _steps(run)
    assert df["loss"].to_list() == pytest.approx([3.0 - s / 10 for s in range(1, 6)])
    assert df["tokens"].to_list() == [4096] * 5 and df["grad_norm"].to_list() == [1.5] * 5
    assert df["eval/loss"].to_list()[-1] == 2.5
    meta = _meta(run)
    assert meta["model"] == {**dataclasses.asdict(_Model()), "seq_len": 32} and meta["peak_tflops"] == 100.0
    assert res.summary["flops_per_token"] > 0 and df["mfu"].drop_nulls().len() == 5
