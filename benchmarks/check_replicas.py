"""replica_divergence on real 4-rank gloo DDP jobs: planted bit flips found, clean runs quiet.

    PYTHONPATH=$PWD python3 benchmarks/check_replicas.py [--trials 20] [--clean-steps 10000] [--seeds 3]

Each trial trains a small MLP for 60 steps with DDP. At a step and rank drawn at random, it flips one
random bit of one random element of a random parameter, and it records the reduced grad norm and
``param_checksum`` every step. The run is ingested, and the check wants exactly one
``replica_divergence`` finding naming that rank from that step. Then ``--seeds`` clean runs of
``--clean-steps`` steps each must have no finding and no "replica check" warning. Prints a table and
exits 1 on any miss.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 4
TRIAL_STEPS = 60


def _model(seed: int):
    torch.manual_seed(seed)
    return torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 16)))


def _plan(trial: int) -> tuple[int, int, int, int, int]:
    """(step, rank, parameter index, element, bit) of a trial's flip, the same on every rank."""
    r = random.Random(trial)
    return r.randint(2, TRIAL_STEPS), r.randrange(WORLD), r.randrange(4), r.randrange(16), r.randrange(32)


def _train(run_dir: str, rank: int, steps: int, seed: int, flip=None) -> None:
    from kforge_record import Recorder
    from kforge_record.replica import PARAM_CHECKSUM, param_checksum

    model = _model(seed)
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=1e-3)
    gen = torch.Generator().manual_seed(seed * 100 + rank)
    with Recorder(run_dir, install_sigterm_handler=False, flush_every_steps=500, hw_every_s=0) as rec:
        for step in range(1, steps + 1):
            rec.start_step()
            if flip is not None and step == flip[0] and rank == flip[1]:
                with torch.no_grad():
                    p = params[flip[2]].view(-1)
                    p.view(torch.int32)[flip[3] % p.numel()] ^= 1 << flip[4]
            x = torch.randn(8, 16, generator=gen)
            loss = (model(x) - x).pow(2).mean()
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(params, 1e9)
            opt.step()
            opt.zero_grad()
            rec.end_step(step, loss=loss, grad_norm=grad_norm, tokens=8, **{PARAM_CHECKSUM: param_checksum(params)})
    dist.barrier()


def _worker(rank, port, root, trials, clean_steps, seeds):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        torch.set_num_threads(1)
        for t in range(trials):
            _train(os.path.join(root, f"trial-{t:02d}"), rank, TRIAL_STEPS, seed=t, flip=_plan(t))
        for s in range(seeds):
            _train(os.path.join(root, f"clean-{s}"), rank, clean_steps, seed=1000 + s)
    finally:
        dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=20)
    p.add_argument("--clean-steps", type=int, default=10_000)
    p.add_argument("--seeds", type=int, default=3)
    args = p.parse_args()
    import socket
    import warnings

    from kforge_dash import ingest_run

    warnings.simplefilter("ignore")  # ingest's MFU warnings: no model given, as intended here

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    bad = 0
    with tempfile.TemporaryDirectory() as root:
        t0 = time.perf_counter()
        mp.spawn(_worker, args=(port, root, args.trials, args.clean_steps, args.seeds), nprocs=WORLD, join=True)
        print(f"trained in {time.perf_counter() - t0:.0f} s")
        print(f"{'run':<10}{'flip (step, rank)':>20}{'found (first step, ranks, metric)':>44}  ok")
        for t in range(args.trials):
            step, rank = _plan(t)[:2]
            s = ingest_run(os.path.join(root, f"trial-{t:02d}")).summary
            found = [(f["first_step"], f["ranks"], f["metric"]) for f in s["findings"] if f["kind"] == "replica_divergence"]
            ok = [(first, ranks) for first, ranks, _ in found] == [(step, [rank])]
            bad += not ok
            print(f"trial-{t:02d}{f'({step}, {rank})':>20}{str(found):>44}  {'yes' if ok else 'NO'}")
        for s_ in range(args.seeds):
            s = ingest_run(os.path.join(root, f"clean-{s_}")).summary
            found = [f for f in s["findings"] if f["kind"] == "replica_divergence"]
            off = [w for w in s["warnings"] if w.startswith("replica check")]
            ok = not found and not off
            bad += not ok
            print(f"clean-{s_:<4}{f'{args.clean_steps} steps':>20}{f'{len(found)} findings, {len(off)} off':>44}  "
                  f"{'yes' if ok else 'NO'}")
    print("all as expected" if not bad else f"{bad} unexpected")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
