"""A torchrun worker for tests/test_ingest_period_ddp.py: DDP over gloo, each rank's own work
jittered, the last rank starting 0.3 s late, and some time between end_step and the next start_step; every rank also times itself
nanoGPT-style (dt between consecutive iterations' ends, on its own clock) into OUT/rank-R.json.

    python -m torch.distributed.run --standalone --nproc-per-node N period_child.py RUN OUT STEPS
"""

from __future__ import annotations

import json
import os
import random
import sys
import time

import torch
import torch.distributed as dist

from kforge_record import Recorder

TOKENS = 64  # per rank and step


def main(run_dir: str, out_dir: str, steps: int) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    rng = random.Random(rank)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(32, 32))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    dts = []
    with Recorder(run_dir, install_sigterm_handler=False, flush_every_steps=10) as rec:
        if rank == dist.get_world_size() - 1:
            time.sleep(0.3)  # reaches the loop late (a slow start): the others wait for it in the first step
        t_first = t0 = time.time()
        for step in range(1, steps + 1):
            rec.start_step()
            with rec.phase("data"):
                x = torch.randn(16, 32)
                time.sleep(0.002 + 0.010 * rng.random())  # this rank's own jitter
            with rec.phase("fwd_bwd"):
                loss = model(x).pow(2).mean()
                loss.backward()  # the all-reduce: everyone waits for the slowest
            opt.step()
            opt.zero_grad()
            rec.end_step(step, loss=loss, tokens=TOKENS)
            t1 = time.time()
            dts.append(t1 - t0)
            t0 = t1
            time.sleep(0.003 + 0.006 * rng.random())  # between end_step and the next start_step
        t_last = t0
    with open(os.path.join(out_dir, f"rank-{rank}.json"), "w") as f:
        json.dump({"first_start": t_first, "last_end": t_last, "dts": dts}, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
