"""Real gloo flight-recorder dumps of small hung jobs on CPU (torch 2.13), for tests/test_hang_fr.py.

    python3 tests/make_fr_gloo.py tests/data/fr_gloo     # writes one folder per case (a few KB)

Each case is a job of N processes on gloo with ``TORCH_FR_BUFFER_SIZE`` set; one rank does not join
a collective; every rank then writes what ``torch._C._distributed_c10d._dump_fr_trace()`` returns (a
pickle, as bytes) to ``rank_<r>`` (and, for the JSON case, ``_dump_fr_trace_json()`` to
``rank_<r>.json``), and exits without waiting for the collective that never completes.

- ``missing_world``: 3 ranks, three all_reduces on the world group; rank 2 skips the fourth.
- ``missing_subgroup``: 4 ranks in groups [0, 1] and [2, 3]; rank 3 skips the second all_reduce of
  its group; ranks 0-2 then issue one more world all_reduce (which rank 3 never reaches).
- ``json_missing_world``: missing_world written as JSON (``_dump_fr_trace_json``).
- ``order_cycle``: 2 ranks call two groups' all_reduces in opposite orders (rank 0: world, then a
  second group of both; rank 1: the reverse): each waits in a collective the other never issued.

CASES maps each to the ranks that did not join (what kforge-hang must name; none in a cycle).
"""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

CASES = {"missing_world": (2,), "missing_subgroup": (3,), "json_missing_world": (2,), "order_cycle": ()}
_WORLD = {"missing_world": 3, "missing_subgroup": 4, "json_missing_world": 3, "order_cycle": 2}


def _job(rank: int, world: int, case: str, out: str, port: int) -> None:
    import datetime

    import torch
    import torch.distributed as dist
    from torch._C._distributed_c10d import _dump_fr_trace, _dump_fr_trace_json

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    t = torch.ones(4)
    pending = []
    if case.endswith("missing_world"):
        for _ in range(3):
            dist.all_reduce(t)
        if rank != 2:
            pending.append(dist.all_reduce(t, async_op=True))
    elif case == "order_cycle":
        other = dist.new_group([0, 1])
        dist.all_reduce(t)
        pending.append(dist.all_reduce(t, group=None if rank == 0 else other, async_op=True))
    else:
        dist.all_reduce(t)
        groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
        mine = groups[rank // 2]
        dist.all_reduce(t, group=mine)
        if rank != 3:
            pending.append(dist.all_reduce(t, group=mine, async_op=True))
            pending.append(dist.all_reduce(t, async_op=True))
    time.sleep(1.0)  # the joining ranks' pending collectives are enqueued and waiting
    name = Path(out) / case / f"rank_{rank}"
    if case.startswith("json"):
        name.with_suffix(".json").write_bytes(_dump_fr_trace_json())
    else:
        name.write_bytes(_dump_fr_trace(includeStackTraces=False))
    sys.stdout.flush()
    os._exit(0)  # the pending collective never completes: do not wait for it at exit


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_case(case: str, out: Path) -> Path:
    """Run one case's job; returns its folder of dumps."""
    import torch.multiprocessing as mp

    (out / case).mkdir(parents=True, exist_ok=True)
    ctx = mp.get_context("spawn")
    port = _free_port()
    procs = [ctx.Process(target=_job, args=(r, _WORLD[case], case, str(out), port)) for r in range(_WORLD[case])]
    before = os.environ.get("TORCH_FR_BUFFER_SIZE")
    os.environ["TORCH_FR_BUFFER_SIZE"] = "64"  # read when each process group is made: the workers inherit it
    try:
        for p in procs:
            p.start()
    finally:  # the caller's environment as it was (a test's process runs other tests after)
        if before is None:
            del os.environ["TORCH_FR_BUFFER_SIZE"]
        else:
            os.environ["TORCH_FR_BUFFER_SIZE"] = before
    for p in procs:
        p.join(60)
        if p.is_alive():
            p.kill()
    return out / case


if __name__ == "__main__":
    dest = Path(sys.argv[1] if len(sys.argv) > 1 else "tests/data/fr_gloo")
    for c in CASES:
        print(write_case(c, dest))
