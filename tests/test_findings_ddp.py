"""Stragglers under real DDP (gloo, two processes): the others wait in the gradient all-reduce.

Two runs from the same two processes: in the first, rank 1's data phase is slow; in the second,
rank 0 spends time between steps (an eval, printing) while rank 1 waits for it in its all-reduce,
so rank 1 has the longer step time. Only the first is a straggler, and it is rank 1 in 'data'.
"""

from __future__ import annotations

import json
import os
import time

import polars as pl
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from ports_fixtures import free_port

from kforge_dash import ingest_run
from kforge_record import Recorder

STEPS = 40
SLOW_S = 0.03


def _train(run_dir, rank, *, slow_data_rank=None, busy_between_rank=None):
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(32, 32))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with Recorder(run_dir, install_sigterm_handler=False, flush_every_steps=20) as rec:
        for step in range(1, STEPS + 1):
            rec.start_step()
            with rec.phase("data"):
                x = torch.randn(16, 32)
                if rank == slow_data_rank:
                    time.sleep(SLOW_S)  # a slow loader on this rank
            with rec.phase("fwd_bwd"):
                loss = model(x).pow(2).mean()
                loss.backward()  # the gradient all-reduce: the fast rank waits here
            with rec.phase("optimizer"):
                opt.step()
                opt.zero_grad()
            rec.end_step(step, loss=loss, tokens=16)
            if rank == busy_between_rank:
                time.sleep(SLOW_S)  # evaluating / printing between steps, outside any step
    dist.barrier()


def _worker(rank, world, port, root):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        torch.set_num_threads(1)
        _train(os.path.join(root, "slow-data"), rank, slow_data_rank=1)
        _train(os.path.join(root, "busy-rank0"), rank, busy_between_rank=0)
    finally:
        dist.destroy_process_group()


def test_the_straggler_is_the_rank_with_slow_own_work_not_the_one_that_waits(tmp_path):
    mp.spawn(_worker, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)

    slow = ingest_run(tmp_path / "slow-data").summary
    (f,) = [f for f in slow["findings"] if f["kind"] == "straggler"]
    host = json.loads(next((tmp_path / "slow-data" / "rank-00001").glob("*/meta.json")).read_text())["host"]
    assert (f["ranks"], f["phase"], f["hosts"]) == ([1], "data", [host])
    assert f["first_step"] <= 5 and f["last_step"] == STEPS
    assert host in f["message"] and "'data' phase" in f["message"]
    # the others waited about SLOW_S a step for it, and goodput counts that as straggler wait
    assert 0.8 * STEPS * SLOW_S < slow["goodput"]["buckets"]["straggler_wait"] < 1.5 * STEPS * SLOW_S
    # the run detail page's "which rank's own work was the longest" says what the finding says (issue 21, item 3)
    from kforge_dash.browse.ranks import slowest_own_work
    from kforge_dash.findings.finding import Phases

    top = slowest_own_work(tmp_path / "slow-data" / "ingested" / "ranks.parquet",
                           Phases.from_summary(slow)).counts.row(0, named=True)
    assert top["rank"] == 1 and top["share"] > 0.9

    busy = tmp_path / "busy-rank0"
    s = ingest_run(busy).summary
    steps = pl.read_parquet(busy / "ingested" / "steps.parquet")
    # the trap: by step time rank 1 is the slow one (it waited in the all-reduce) ...
    assert steps.filter(pl.col("step") > 1)["slowest_rank"].mode().to_list() == [1]
    # ... but it is nobody's straggler, and rank 0's time between steps is not productive
    assert [f for f in s["findings"] if f["kind"] == "straggler"] == []
    assert s["goodput"]["buckets"]["between_steps"] > 0.8 * (STEPS - 1) * SLOW_S
