"""A 4-rank gloo DDP job (torchrun --nproc_per_node=4) with ranks that stall, for the hang tests.

Usage: torchrun --nproc_per_node=4 hang_child.py RUN_DIR MODES RANKS STEP

MODES and RANKS are comma lists, paired: ``compute,gil 2,3`` stalls rank 2 in compute and rank 3
holding the GIL, each at step STEP. A mode, for its rank at STEP:

* compute: sleeps inside its ``fwd_bwd`` phase (the others wait in backward's all_reduce);
* data: sleeps inside its ``data`` phase;
* gil: calls libc's sleep through ctypes.PyDLL inside ``fwd_bwd``: a C call that holds the GIL.

MODES ``checkpoint`` (RANKS ignored) is a clean job of STEP steps that checkpoints every 10 steps
(rank 0 saves, then sleeps 5.5 s: a slow filesystem; every rank then waits in a barrier), inside a
``checkpoint`` phase longer than hang_after_s, allowed by ``hang_allow_s``; then it closes.

The recorder's hang watch is on with hang_after_s=3; the test kills a stalled job once the stall's
evidence is written.
"""

import ctypes
import os
import sys
import time

import torch
import torch.distributed as dist

from kforge_record import Recorder

run_dir, modes, ranks, stuck_step = sys.argv[1], sys.argv[2].split(","), sys.argv[3].split(","), int(sys.argv[4])
dist.init_process_group("gloo")
rank = dist.get_rank()
clean = modes == ["checkpoint"]
mode = "" if clean else dict(zip(map(int, ranks), modes)).get(rank, "")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 8))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
rec = Recorder(run_dir, hang_after_s=3.0, flush_every_steps=1000, hw_every_s=0, hang_allow_s={"checkpoint": 120.0})


def stall():
    time.sleep(3600)  # the stuck rank's line


def hold_gil():
    ctypes.PyDLL(None).sleep(3600)  # a C call that never releases the GIL


def checkpoint(step):
    with rec.phase("checkpoint"):
        if rank == 0:
            torch.save(model.state_dict(), os.path.join(os.path.dirname(os.path.abspath(run_dir)), f"ckpt-{step}.pt"))
            time.sleep(5.5)  # a slow filesystem: longer than hang_after_s and its 2 s faulthandler grace
        dist.barrier()


for step in range(1, stuck_step + 1 if clean else 1000):
    with rec.phase("data"):
        if mode == "data" and step == stuck_step:
            stall()
        x = torch.randn(16, 8)
    with rec.phase("fwd_bwd"):
        loss = model(x).pow(2).mean()
        if mode == "compute" and step == stuck_step:
            stall()
        if mode == "gil" and step == stuck_step:
            hold_gil()
        loss.backward()
    with rec.phase("optimizer"):
        opt.step()
        opt.zero_grad()
    rec.end_step(step, loss=loss.item(), tokens=16)
    if clean and step % 10 == 0:
        checkpoint(step)
    time.sleep(0.01)
rec.close()
dist.destroy_process_group()
