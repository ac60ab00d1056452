"""replica_divergence: a minority of ranks whose replica-identical value (grad norm after the all-reduce, the
parameter checksum) differs from the majority's; off for a rank-local value. Synthetic shards, then a real
4-rank gloo DDP job with one bit of one rank's parameter flipped."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from ingest_fixtures import close_all, open_ranks, run_steps
from ports_fixtures import free_port

from kforge_dash import ingest_run
from kforge_record import Recorder
from kforge_record.replica import PARAM_CHECKSUM, param_checksum


def _record(tmp_path, monkeypatch, values, world=4, steps=60):
    run = tmp_path / "run"
    recs = open_ranks(str(run), world, hw_every_s=0)
    run_steps(monkeypatch, recs, range(1, steps + 1), step_time=lambda r, s: 0.1, values=values)
    close_all(recs)
    return ingest_run(run).summary


def _replica(summary):
    return [f for f in summary["findings"] if f["kind"] == "replica_divergence"]


def test_a_rank_whose_grad_norm_leaves_the_majority_is_named_from_that_step(tmp_path, monkeypatch):
    def values(rank, step):
        g = 1.0 + step * 0.01
        return {"loss": 1.0 / step, "tokens": 10, "grad_norm": g * (1 + 1e-6) if rank == 2 and step >= 37 else g}

    s = _record(tmp_path, monkeypatch, values)
    [f] = _replica(s)
    assert (f["ranks"], f["first_step"], f["last_step"], f["metric"], f["severity"]) == ([2], 37, 60, "grad_norm", "error")
    assert "rank 2 from step 37" in f["message"] and "1.0e-06" in f["message"]
    assert f["hosts"] and f["score"] == 24
    from kforge_dash.findings.host_table import host_lines, host_table

    [entry] = host_table([s])  # the hosts table counts the run against the minority's host
    assert (entry["host"], entry["divergence_runs"]) == (f["hosts"][0], 1)
    assert "replicas diverged in 1" in host_lines([entry])[1]


def test_agreeing_replicas_give_no_finding_and_a_rank_local_value_turns_the_check_off_with_one_warning(
        tmp_path, monkeypatch):
    def values(rank, step):
        return {"loss": 1.0 / step, "tokens": 10, "grad_norm": 1.0 + rank * 0.1 + step,  # pre-reduce: per rank
                PARAM_CHECKSUM: float(1000 + step)}  # every rank the same

    s = _record(tmp_path, monkeypatch, values)
    assert _replica(s) == []
    [w] = [w for w in s["warnings"] if w.startswith("replica check")]
    assert "grad_norm" in w and "not checked" in w


def test_two_ranks_have_no_majority_to_name(tmp_path, monkeypatch):
    s = _record(tmp_path, monkeypatch, lambda r, st: {"loss": 1.0, "tokens": 1, "grad_norm": 1.0 + (r if st > 50 else 0)},
                world=2)
    assert _replica(s) == []


def test_each_model_parallel_group_checksum_is_compared_among_its_own_ranks(tmp_path, monkeypatch):
    from kforge_record.replica import group_checksum_name

    def values(rank, step):
        group = "tp0" if rank < 3 else "tp1"  # two shards, each replicated on three ranks
        base = 1000.0 * (1 + rank // 3) + step
        return {"loss": 1.0, "tokens": 1, group_checksum_name(group): base + (1 if rank == 4 and step >= 20 else 0)}

    s = _record(tmp_path, monkeypatch, values, world=6, steps=30)
    [f] = _replica(s)
    assert (f["metric"], f["ranks"], f["first_step"]) == ("param_checksum/tp1", [4], 20)
    assert "parameter checksum of tp1" in f["message"]
    assert not [w for w in s["warnings"] if w.startswith("replica check")]


FLIP_STEP, FLIP_RANK, STEPS = 25, 2, 40


def _worker(rank, world, port, run_dir):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        torch.set_num_threads(1)
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 16))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        torch.manual_seed(1 + rank)
        with Recorder(run_dir, install_sigterm_handler=False, flush_every_steps=20, hw_every_s=0) as rec:
            for step in range(1, STEPS + 1):
                rec.start_step()
                if step == FLIP_STEP and rank == FLIP_RANK:
                    with torch.no_grad():  # a silent data corruption: one bit of one weight
                        model.module.weight.view(-1).view(torch.int32)[5] ^= 1 << 3
                loss = model(torch.randn(8, 16)).pow(2).mean()
                loss.backward()
                grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)
                opt.step()
                opt.zero_grad()
                rec.end_step(step, loss=loss, grad_norm=grad_norm, tokens=8,
                             **{PARAM_CHECKSUM: param_checksum(model.parameters())})
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_a_bit_flipped_in_one_ddp_replica_is_found_at_its_rank_and_step(tmp_path):
    run = tmp_path / "ddp"
    mp.spawn(_worker, args=(4, free_port(), str(run)), nprocs=4, join=True)
    s = ingest_run(run).summary
    [f] = _replica(s)  # the reduced grad norm agrees on every rank: only the checksum tells
    assert (f["metric"], f["ranks"], f["first_step"], f["last_step"]) == (PARAM_CHECKSUM, [FLIP_RANK], FLIP_STEP, STEPS)
    assert not [w for w in s["warnings"] if w.startswith("replica check")]
    assert os.path.isdir(run / "ingested")


def test_a_step_majority_is_the_same_from_the_rank_by_step_grid_and_from_the_group_by():
    """The fast path (every rank recorded every step of the window: a grid sorted down each step) and the
    group_by give the same n, majority, and majority value and count: ties, -0.0 against 0.0, one rank."""
    import numpy as np
    import polars as pl

    from kforge_dash.findings import replicas

    rng = np.random.default_rng(7)
    used = 0
    for _ in range(200):
        ranks, steps = int(rng.integers(1, 8)), int(rng.integers(1, 30))
        pool = [0.0, -0.0, 1.0, 2.5, -3.0, 1e308][: int(rng.integers(1, 7))]
        df = pl.DataFrame({"attempt": np.zeros(ranks * steps, np.int64),
                           "step": np.tile(np.arange(1, 3 * steps + 1, 3, dtype=np.int64), ranks),
                           "rank": np.repeat(np.arange(ranks, dtype=np.int64), steps),
                           "v": rng.choice(pool, ranks * steps)})
        grid = replicas._grid_majority(df)
        used += grid is not None
        # the group_by: the same rows in an order the grid does not take (steps not rank after rank)
        by = replicas._step_majority(df.sort("step", "rank").lazy())
        grid = by if grid is None else grid
        key = ["attempt", "step"]
        grid, by = grid.sort(key), by.sort(key)
        assert grid.select(*key, "n", "majority").equals(by.select(*key, "n", "majority"))
        assert grid.filter("majority")["n_v"].equals(by.filter("majority")["n_v"])
        assert (grid.filter("majority")["v"] == by.filter("majority")["v"]).all()
    assert used > 100
