"""Does recording CUDA tensors synchronise the training loop? A short check for a GPU machine.

The loop enqueues GPU work (matmuls) and hands the recorder 0-dim CUDA tensors each step. If the
recorder forced a sync, the host could not run ahead of the GPU: host time for the loop would be
close to the GPU time. Without a sync the host finishes enqueueing long before the GPU finishes.
We compare three loops side by side: no recorder, the kforge recorder, and the in-loop habit of
calling ``loss.item()`` each step (what online trackers do), which does synchronise.

    python benchmarks/gpu_check_record.py [--steps 40] [--n 8192]

Prints host time / GPU time per loop; ~1.0 means serialised, well below 1.0 means the host ran ahead.
"""

import argparse
import math
import sys
import tempfile
import time

import torch


def run(mode: str, steps: int, n: int, tmp: str) -> tuple[float, float, list[float]]:
    from kforge_record import Recorder

    x = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, n, device="cuda", dtype=torch.bfloat16) / math.sqrt(n)
    rec = Recorder(f"{tmp}/{mode}", rank=0, world_size=1, flush_every_steps=10, memory_every_steps=1) if mode == "kforge" else None
    seen = []
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    t0 = time.perf_counter()
    for step in range(1, steps + 1):
        y = x
        for _ in range(6):
            y = y @ w
        loss = y.float().pow(2).mean()
        if mode == "kforge":
            rec.end_step(step, loss=loss, grad_norm=y.float().norm(), lr=1e-4, tokens=n)
        elif mode == "item":
            seen.append(loss.item())
    host = time.perf_counter() - t0
    end.record()
    torch.cuda.synchronize()
    gpu = start.elapsed_time(end) / 1e3
    if rec is not None:
        rec.close()
        import glob

        import pyarrow.parquet as pq

        seen = pq.read_table(sorted(glob.glob(f"{tmp}/{mode}/rank-*/*/part-*.parquet"))).column("loss").to_pylist()
    return host, gpu, seen


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--n", type=int, default=8192)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: this check needs a GPU", file=sys.stderr)
        return 2
    print(f"device: {torch.cuda.get_device_name()}  steps: {args.steps}  matmul: {args.n}^2 bf16 x6 per step")
    with tempfile.TemporaryDirectory() as tmp:
        run("none", 3, args.n, tmp)  # warm-up (cuBLAS handles, allocator)
        rows = {m: run(m, args.steps, args.n, tmp) for m in ("none", "kforge", "item")}
    print(f"{'loop':<10}{'host s':>10}{'GPU s':>10}{'host/GPU':>10}")
    for m, (host, gpu, _) in rows.items():
        print(f"{m:<10}{host:>10.4f}{gpu:>10.4f}{host / gpu:>10.3f}")
    k, i = rows["kforge"][2], rows["item"][2]
    print(f"recorded losses: {len(k)} (all finite: {all(math.isfinite(v) for v in k)}); .item() loop: {len(i)}")
    ok = rows["kforge"][0] / rows["kforge"][1] < 0.5 * rows["item"][0] / rows["item"][1] and len(k) == args.steps
    print("verdict:", "no per-step sync from the recorder" if ok else "recorder appears to serialise the loop")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
