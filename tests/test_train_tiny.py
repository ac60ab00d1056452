"""examples/train_tiny.py really trains with two ranks, survives SIGTERM and resumes; sample_runs/ is sound."""

import json
import math
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from kforge_record.check import check_run

REPO = Path(__file__).resolve().parents[1]
TRAIN = REPO / "examples" / "train_tiny.py"
SAMPLE_RUNS = REPO / "sample_runs"

# A smaller model than the default so the test stays quick on two shared cores.
TINY = ["--dim", "32", "--n-layers", "1", "--n-heads", "4", "--n-kv-heads", "2", "--ffn-hidden-dim", "96",
        "--batch-size", "4", "--seq-len", "32", "--eval-batches", "1"]


def torchrun(run_dir, ckpt_dir, *args, sigterm_after_step=None):
    """Launch two ranks; optionally SIGTERM both workers once rank 0 logs that step. Returns (status, log)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(TRAIN),
           "--run-dir", str(run_dir), "--ckpt-dir", str(ckpt_dir), *TINY, *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    pids, log = [], []
    for line in proc.stdout:
        log.append(line)
        pids += [int(pid) for pid in re.findall(r"rank \d+/2 pid (\d+)", line)]
        m = re.match(r"step (\d+) ", line)
        if sigterm_after_step is not None and m and int(m[1]) >= sigterm_after_step:
            assert len(pids) == 2, "".join(log)
            for pid in pids:
                os.kill(pid, signal.SIGTERM)
            sigterm_after_step = None
    rc = proc.wait(timeout=60)
    return rc, "".join(log)


def attempts_of(rank_dir):
    """[(meta, end, frame)] for each attempt of one rank, in launch order (meta.json start_time)."""
    out = []
    for d in rank_dir.iterdir():
        meta = json.loads((d / "meta.json").read_text())
        end = json.loads((d / "end.json").read_text()) if (d / "end.json").exists() else None
        # Column sets may differ between part files (eval/loss, checkpoint appear mid-run): diagonal concat.
        frame = pl.concat([pl.read_parquet(p) for p in sorted(d.glob("part-*.parquet"))], how="diagonal")
        out.append((meta, end, frame))
    return sorted(out, key=lambda a: a[0]["start_time"])


def step_rows(frame):
    return frame.filter(pl.col("step_time_s").is_not_null()).sort("step")  # drop the rec.log() rows


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_sigterm_then_relaunch_resumes_from_checkpoint(tmp_path):
    run, ckpt = tmp_path / "runs" / "tiny", tmp_path / "ckpt"
    # flush-every 1000: nothing reaches disk before the kill except through the recorder's SIGTERM flush.
    # slow-ms paces the steps (>= 20 ms each) so the SIGTERM sent after step 25 lands well before
    # the step-40 checkpoint even when this machine is loaded.
    args = ["--max-steps", "40", "--ckpt-every", "20", "--eval-every", "10", "--log-every", "5",
            "--flush-every", "1000", "--lr", "2e-3", "--slow-rank", "1", "--slow-ms", "20", "--tag", "test"]
    rc, log = torchrun(run, ckpt, *args, sigterm_after_step=25)
    assert rc != 0, log  # the job died of the preemption
    rc, log = torchrun(run, ckpt, *args)
    assert rc == 0, log
    assert "resumes after step 20" in log

    assert sorted(p.name for p in run.iterdir()) == ["rank-00000", "rank-00001"]
    assert check_run(run) == []
    for rank in (0, 1):
        (meta1, end1, first), (meta2, end2, second) = attempts_of(run / f"rank-{rank:05d}")
        assert end1["reason"] == "sigterm" and end2["reason"] == "close"
        a, b = step_rows(first), step_rows(second)
        # The first attempt's tail was flushed on SIGTERM (rank 0 had logged step 25, so rank 1 had
        # at least finished step 24: step 25's all-reduce needed it); the relaunch starts after the
        # step-20 checkpoint.
        last = a["step"].max()
        assert a["step"].to_list() == list(range(1, last + 1)) and last >= (25 if rank == 0 else 24), (rank, last)
        assert b["step"].to_list() == list(range(21, 41))
        # Resuming is exact: the overlapping steps saw the same weights and the same batches.
        overlap = a.join(b, on="step", suffix="_2")
        assert overlap["step"].to_list() == list(range(21, last + 1))
        assert overlap["loss"].to_list() == pytest.approx(overlap["loss_2"].to_list(), rel=1e-5)

        for meta in (meta1, meta2):
            assert (meta["rank"], meta["world_size"]) == (rank, 2)
            assert meta["peak_tflops"] > 0
            assert meta["model"] == {"n_layers": 1, "dim": 32, "n_heads": 4, "n_kv_heads": 2,
                                     "ffn_hidden_dim": 96, "vocab_size": meta["model"]["vocab_size"], "seq_len": 32}
            assert meta["hparams"]["lr"] == 2e-3 and meta["tags"] == ["test"]
        both = pl.concat([a, b], how="diagonal")
        for col in ("time/data_s", "time/fwd_bwd_s", "time/optimizer_s"):
            assert both[col].null_count() == 0 and (both[col] >= 0).all()
        assert both["tokens"].unique().to_list() == [4 * 32]
        assert both.select(pl.col("loss", "grad_norm", "lr").is_finite().all()).row(0) == (True, True, True)
        assert both["mem_allocated_bytes"].null_count() == both.height  # CPU: memory is null, never 0
        evals = pl.concat([first, second], how="diagonal").drop_nulls("eval/loss")
        assert set(evals["step"]) >= {10, 20, 30, 40} and evals["eval/loss"].is_finite().all()
        # Only rank 0 writes checkpoints, so only it has the phase (null is "not this rank", never 0).
        saved = both.drop_nulls("time/checkpoint_s")["step"].to_list() if "time/checkpoint_s" in both.columns else []
        assert saved == ([20, 40] if rank == 0 else [])


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_fault_flags_make_a_straggler_a_spike_and_a_skipped_nan_step(tmp_path):
    run = tmp_path / "runs" / "faults"
    rc, log = torchrun(run, tmp_path / "ckpt", "--max-steps", "12", "--slow-rank", "1", "--slow-ms", "30",
                       "--spike-step", "4", "--spike-len", "2", "--spike-lr-mult", "50", "--nan-step", "8")
    assert rc == 0, log
    ranks = [step_rows(attempts_of(run / f"rank-{r:05d}")[0][2]) for r in (0, 1)]
    r0, r1 = ranks
    # Straggler: rank 1's data phase carries the sleep; rank 0 waits for it inside the all-reduce.
    assert r1["time/data_s"].median() >= 0.03 > r0["time/data_s"].median()
    assert r0["time/fwd_bwd_s"].median() > r1["time/fwd_bwd_s"].median()
    # Spike: the recorded lr jumps by the multiplier for exactly the spike window.
    lr = dict(zip(r0["step"], r0["lr"]))
    assert lr[4] > 20 * lr[3] and lr[5] > 20 * lr[6]
    # NaN step: rank 0's loss is NaN, every rank's grad norm is non-finite, and training carries on
    # with finite losses (the optimizer step was skipped, or the weights would be NaN from then on).
    for r, frame in enumerate(ranks):
        row = frame.filter(pl.col("step") == 8)
        assert math.isnan(row["loss"][0]) == (r == 0)
        assert not math.isfinite(row["grad_norm"][0])
        assert frame.filter(pl.col("step") > 8)["loss"].is_finite().all()


# -- the committed sample_runs/ ------------------------------------------------------------------

def runs_on_disk():
    return sorted(p for p in SAMPLE_RUNS.iterdir() if p.is_dir() and any(p.glob("rank-*")))


def test_sample_runs_follow_the_contract_and_stay_small():
    runs = runs_on_disk()
    assert len(runs) >= 4
    for run in runs:
        assert check_run(run) == [], run.name
    committed = [p for p in SAMPLE_RUNS.rglob("*") if p.is_file() and "ingested" not in p.relative_to(SAMPLE_RUNS).parts]
    assert sum(p.stat().st_size for p in committed) <= 5 * 2**20


def test_sample_runs_note_matches_the_data():
    """sample_runs/README.md lists steps, ranks and attempts; they must be what is on disk."""
    table = {}
    for line in (SAMPLE_RUNS / "README.md").read_text().splitlines():
        if m := re.match(r"\| (\S+) \| (\d+)-(\d+) \| (\d+) \| (\d+) \(", line):
            table[m[1]] = tuple(int(x) for x in m.groups()[1:])
    assert sorted(table) == sorted(p.name for p in runs_on_disk())
    for name, (first, last, n_ranks, n_attempts) in table.items():
        rank_dirs = sorted((SAMPLE_RUNS / name).glob("rank-*"))
        assert len(rank_dirs) == n_ranks
        for rank_dir in rank_dirs:
            atts = attempts_of(rank_dir)
            assert len(atts) == n_attempts
            steps = pl.concat([step_rows(f) for _, _, f in atts])["step"]
            assert (steps.min(), steps.max()) == (first, last)


def test_sample_runs_show_what_they_claim():
    runs = {p.name: p for p in runs_on_disk()}
    metas = {name: attempts_of(run / "rank-00000")[0][0] for name, run in runs.items()}

    # Baselines differ only in the learning rate.
    baselines = [n for n in runs if "baseline" in metas[n]["tags"]]
    assert len(baselines) >= 2
    for n in baselines[1:]:
        a, b = metas[baselines[0]]["hparams"], metas[n]["hparams"]
        assert {k for k in a.keys() | b.keys() if a.get(k) != b.get(k)} == {"lr"}

    # Preempted: two attempts per rank, the first killed by SIGTERM, the second resuming before its last step.
    (preempted,) = [n for n in runs if "preempted" in metas[n]["tags"]]
    for rank_dir in sorted(runs[preempted].glob("rank-*")):
        (_, end1, first), (_, end2, second) = attempts_of(rank_dir)
        assert end1["reason"] == "sigterm" and end2["reason"] == "close"
        assert step_rows(second)["step"].min() <= step_rows(first)["step"].max()

    # Straggler: the slow rank's data phase is far slower than the other's.
    (straggler,) = [n for n in runs if "straggler" in metas[n]["tags"]]
    slow = metas[straggler]["hparams"]["slow_rank"]
    data_s = {int(d.name[5:]): step_rows(attempts_of(d)[0][2])["time/data_s"].median()
              for d in runs[straggler].glob("rank-*")}
    assert data_s[slow] > 10 * max(v for r, v in data_s.items() if r != slow)

    # Spike and NaN: a recorded NaN loss, and the loss jumps after the lr spike.
    (faulty,) = [n for n in runs if "fault-injection" in metas[n]["tags"] and metas[n]["hparams"].get("nan_step")]
    hp = metas[faulty]["hparams"]
    r0 = step_rows(attempts_of(runs[faulty] / "rank-00000")[0][2])
    loss = dict(zip(r0["step"], r0["loss"]))
    assert math.isnan(loss[hp["nan_step"]])
    before = r0.filter(pl.col("step").is_between(hp["spike_step"] - 10, hp["spike_step"] - 1))["loss"].mean()
    after = r0.filter(pl.col("step").is_between(hp["spike_step"] + 1, hp["spike_step"] + 10))["loss"].max()
    assert after > before + 0.5


def test_sample_runs_are_deterministic_from_the_seed():
    """Runs that differ only in timing (the straggler's sleep, a preemption) trained identically."""
    def losses(run):  # rank 0; where attempts overlap the later one wins, as after a restart
        frames = [step_rows(f) for _, _, f in attempts_of(run / "rank-00000")]
        merged = pl.concat(frames, how="diagonal").unique("step", keep="last", maintain_order=True)
        return merged.sort("step")["loss"].to_list()

    groups = {}
    for run in runs_on_disk():
        hp = attempts_of(run / "rank-00000")[0][0]["hparams"]
        key = json.dumps({k: v for k, v in hp.items() if k not in ("slow_rank", "slow_ms")}, sort_keys=True)
        groups.setdefault(key, []).append(run)
    compared = 0
    for first, *others in groups.values():
        for other in others:
            assert losses(other) == losses(first), (first.name, other.name)
            compared += 1
    assert compared >= 2  # the preempted run and the straggler each match the baseline with their lr
