"""Rank and world size come from torch.distributed (gloo, two processes)."""

import json
import os

import polars as pl
import torch.distributed as dist
import torch.multiprocessing as mp
from ports_fixtures import free_port

from kforge_record import Recorder


def _worker(rank, world, port, run_dir):
    # No RANK/WORLD_SIZE in the environment: the recorder must ask torch.distributed.
    for k in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS"):
        os.environ.pop(k, None)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        with Recorder(run_dir, counts_tokens=(rank == 0)) as rec:
            for step in range(1, 11):
                rec.end_step(step, loss=float(rank + step), tokens=100 * (rank + 1))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_two_gloo_ranks_write_two_rank_folders(tmp_path):
    run = tmp_path / "run"
    mp.spawn(_worker, args=(2, free_port(), str(run)), nprocs=2, join=True)
    assert sorted(p.name for p in run.iterdir()) == ["rank-00000", "rank-00001"]
    for rank in (0, 1):
        (meta_path,) = run.glob(f"rank-{rank:05d}/*/meta.json")
        meta = json.loads(meta_path.read_text())
        assert (meta["rank"], meta["world_size"]) == (rank, 2)
        assert meta["counts_tokens"] is (rank == 0)
        df = pl.read_parquet(sorted(meta_path.parent.glob("part-*.parquet")))
        assert df["step"].to_list() == list(range(1, 11))
        assert df["loss"].to_list() == [float(rank + s) for s in range(1, 11)]
        assert df["tokens"].unique().to_list() == [100 * (rank + 1)]


def test_environment_variables_give_rank_when_not_initialised(tmp_path, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setenv("SLURM_PROCID", "3")
    monkeypatch.setenv("SLURM_NTASKS", "8")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    with Recorder(tmp_path / "run") as rec:
        rec.end_step(1, loss=1.0)
    (meta_path,) = (tmp_path / "run").glob("rank-00003/*/meta.json")
    meta = json.loads(meta_path.read_text())
    assert (meta["rank"], meta["world_size"]) == (3, 8)
    assert meta["launch"]["slurm_job_id"] == "4242" and "slurm4242" in meta["attempt_id"]
    monkeypatch.setenv("RANK", "1")  # torchrun's variables win over Slurm's
    monkeypatch.setenv("WORLD_SIZE", "2")
    with Recorder(tmp_path / "run2") as rec:
        assert (rec.rank, rec.world_size) == (1, 2)


def test_ranks_of_one_slurm_launch_share_the_attempt_id(tmp_path, monkeypatch):
    for k, v in {"SLURM_JOB_ID": "777", "SLURM_STEP_ID": "0", "SLURM_JOB_START_TIME": "1796080000",
                 "SLURM_RESTART_COUNT": "1", "SLURM_NTASKS": "2"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    ids = []
    for rank in (0, 1):
        monkeypatch.setenv("SLURM_PROCID", str(rank))
        with Recorder(tmp_path / "run") as rec:
            rec.end_step(1, loss=1.0)
            ids.append(rec.attempt_id)
    assert ids[0] == ids[1] and "slurm777.0" in ids[0] and "r001" in ids[0]
    assert ids[0].startswith("20261130T")  # the job's start time (1796080000 s), so ids sort by launch
    # The same rank meeting the same id again writes a folder of its own, never into the first one.
    monkeypatch.setenv("SLURM_PROCID", "0")
    with Recorder(tmp_path / "run") as rec:
        rec.end_step(1, loss=2.0)
        assert rec.attempt_id != ids[0]
    assert len(list((tmp_path / "run" / "rank-00000").iterdir())) == 2
