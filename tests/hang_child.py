"""A 4-rank gloo DDP job (torchrun --nproc_per_node=4) with one rank that stalls, for the hang tests.

Usage: torchrun --nproc_per_node=4 hang_child.py RUN_DIR MODE STUCK_RANK STUCK_STEP

MODE compute: the stuck rank sleeps inside its ``fwd_bwd`` phase at STUCK_STEP (the others wait in
backward's all_reduce); MODE data: inside its ``data`` phase. The recorder's hang watch is on with
hang_after_s=3; the test kills the job once the stall's evidence is written.
"""

import sys
import time

import torch
import torch.distributed as dist

from kforge_record import Recorder

run_dir, mode, stuck_rank, stuck_step = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
dist.init_process_group("gloo")
rank = dist.get_rank()
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 8))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
rec = Recorder(run_dir, hang_after_s=3.0, flush_every_steps=1000, hw_every_s=0)


def stall():
    time.sleep(3600)  # the stuck rank's line


for step in range(1, 1000):
    with rec.phase("data"):
        if mode == "data" and rank == stuck_rank and step == stuck_step:
            stall()
        x = torch.randn(16, 8)
    with rec.phase("fwd_bwd"):
        loss = model(x).pow(2).mean()
        if mode == "compute" and rank == stuck_rank and step == stuck_step:
            stall()
        loss.backward()
    with rec.phase("optimizer"):
        opt.step()
        opt.zero_grad()
    rec.end_step(step, loss=loss.item(), tokens=16)
    time.sleep(0.01)
