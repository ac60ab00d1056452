"""Ingested outputs (steps.parquet, ranks.parquet, summary.json) that follow docs/CONTRACT.md.

Written directly with pyarrow, independently of kforge_dash.ingest.run, so the export tests do not
depend on the ingest being right. The history has what export must carry: a restart (attempt 0 then
1), NaN and inf values, nulls (memory sampled every 10 steps, an eval metric every 25 steps, a rank
missing at one step), phase timers and a user scalar.
"""

from __future__ import annotations

import json
import math
import os
import random

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

NAN_LOSS_STEP = 7
INF_GRAD_STEP = 9
MISSING_RANK = (12, 1)  # (step, rank): that rank did not report that step


def make_ingested_run(root, name: str = "run-a", *, n_steps: int = 40, world_size: int = 2, first_step: int = 1,
                      hparams: dict | None = None, seed: int = 0,
                      t0: float = 1_790_000_000.25, first_attempt_id: str = "20261130T000000.000000Z") -> str:
    """Create ROOT/NAME/ingested/{steps,ranks}.parquet + summary.json; returns the run dir."""
    rng = random.Random(seed)
    run_dir = os.path.join(os.fspath(root), name)
    ing = os.path.join(run_dir, "ingested")
    os.makedirs(ing, exist_ok=True)
    restart_at = first_step + n_steps // 2
    ranks_rows, steps_rows = [], []
    t = t0
    loss_ema = None
    for step in range(first_step, first_step + n_steps):
        attempt = 0 if step < restart_at else 1
        per_rank = []
        for r in range(world_size):
            if (step, r) == MISSING_RANK:
                continue
            st = 0.5 + rng.random() * 0.1 + (0.2 if r == world_size - 1 else 0.0)
            per_rank.append({
                "step": step, "rank": r, "attempt": attempt, "time": t + st, "step_time_s": st,
                "loss": float("nan") if step == NAN_LOSS_STEP else 3.0 / math.sqrt(step) + rng.random() * 0.01,
                "grad_norm": float("inf") if step == INF_GRAD_STEP and r == 0 else 1.0 + rng.random(),
                "lr": 3e-4 * min(1.0, step / 10), "tokens": 4096,
                "mem_allocated_bytes": 40 * 2**30 + r * 2**20 if step % 10 == 1 else None,
                "mem_peak_bytes": 60 * 2**30 + step * 2**20 if step % 10 == 1 else None,
                "mem_reserved_bytes": 70 * 2**30 if step % 10 == 1 else None,
                "time/data_s": 0.01 + rng.random() * 0.01, "time/fwd_bwd_s": 0.4 + rng.random() * 0.05,
                "eval/loss": 2.5 - step / 100 if step % 25 == 0 else None,
            })
        ranks_rows += per_rank
        slow = max(per_rank, key=lambda x: (x["step_time_s"], -x["rank"]))
        sts = sorted(x["step_time_s"] for x in per_rank)
        t += slow["step_time_s"]
        tokens = sum(x["tokens"] for x in per_rank)
        losses = [x["loss"] for x in per_rank]
        loss = sum(losses) / len(losses)
        if math.isfinite(loss):
            loss_ema = loss if loss_ema is None else 0.1 * loss + 0.9 * loss_ema
        mem = [x["mem_peak_bytes"] for x in per_rank if x["mem_peak_bytes"] is not None]
        steps_rows.append({
            "step": step, "time": max(x["time"] for x in per_rank), "step_time_s": slow["step_time_s"],
            "step_work_s": slow["step_time_s"], "step_work_min_s": sts[0],
            "step_work_median_s": sts[len(sts) // 2], "slowest_rank": slow["rank"],
            "n_ranks": len(per_rank), "attempt": attempt, "tokens": tokens,
            "tokens_per_sec": tokens / slow["step_time_s"], "mfu": None if step < first_step + 2 else 0.4 + rng.random() * 0.01,
            "loss": loss, "grad_norm": per_rank[0]["grad_norm"], "lr": per_rank[0]["lr"],
            "mem_allocated_bytes": max(x["mem_allocated_bytes"] for x in per_rank) if mem else None,
            "mem_peak_bytes": max(mem) if mem else None,
            "mem_reserved_bytes": max(x["mem_reserved_bytes"] for x in per_rank) if mem else None,
            "time/data_s": sum(x["time/data_s"] for x in per_rank) / len(per_rank),
            "time/fwd_bwd_s": sum(x["time/fwd_bwd_s"] for x in per_rank) / len(per_rank),
            "eval/loss": per_rank[0]["eval/loss"],
            "loss_ema": loss_ema, "tokens_per_sec_ema": None, "mfu_ema": None, "step_time_s_ema": None,
        })
    ints = {"step", "rank", "attempt", "tokens", "slowest_rank", "n_ranks",
            "mem_allocated_bytes", "mem_peak_bytes", "mem_reserved_bytes"}
    pq.write_table(_table(steps_rows, ints), os.path.join(ing, "steps.parquet"))
    pq.write_table(_table(ranks_rows, ints), os.path.join(ing, "ranks.parquet"))
    summary = {
        "schema_version": "1.0", "run_name": name, "ingested_at": t0 + 10_000, "steps": n_steps,
        "first_step": first_step, "last_step": first_step + n_steps - 1, "world_size": world_size,
        "ranks": list(range(world_size)),
        "attempts": [
            {"attempt": 0, "attempt_ids": [f"{first_attempt_id}-p{100 + r}" for r in range(world_size)],
             "start_time": t0, "first_step": first_step, "last_step": restart_at - 1, "world_size": world_size},
            {"attempt": 1, "attempt_ids": [f"20261130T010000.000000Z-p{200 + r}" for r in range(world_size)],
             "start_time": t0 + 3600, "first_step": restart_at, "last_step": first_step + n_steps - 1,
             "world_size": world_size},
        ],
        "restarts": [{"attempt": 1, "resumed_at_step": restart_at, "previous_last_step": restart_at + 2,
                      "superseded_steps": 3, "time": t0 + 3600}],
        "tokens": sum(r["tokens"] for r in steps_rows), "wall_time_s": t - t0, "mean_tokens_per_sec": 8000.0,
        "mean_mfu": 0.4, "final_loss": steps_rows[-1]["loss"], "best_loss": 0.5, "peak_mem_bytes": 60 * 2**30,
        "device": {"name": "NVIDIA H100 80GB HBM3", "type": "cuda", "total_memory_bytes": 80 * 2**30},
        "model": {"flops_per_token": 6.7e9}, "flops_per_token": 6.7e9, "flops_source": "model.flops_per_token",
        "peak_tflops": 989.0, "peak_source": "table", "alpha": 0.1,
        "hparams": hparams if hparams is not None else {"lr": 3e-4, "batch_size": 8, "optim": {"name": "adamw"}},
        "tags": ["baseline"], "nonfinite": {"loss": 1, "grad_norm": 1}, "dropped_rows": 0,
        "warnings": ["rank 1 did not report step 12"], "exports": None,
    }
    with open(os.path.join(ing, "summary.json"), "w") as f:
        json.dump(summary, f)
    return run_dir


def _table(rows: list[dict], ints: set) -> pa.Table:
    names = list(rows[0])
    return pa.table({n: pa.array([r.get(n) for r in rows], type=pa.int64() if n in ints else pa.float64()) for n in names})


# -- what the TensorBoard / W&B exports of such a run must hold ---------------------------------------

TAGS = {
    "loss": "1_train/loss", "grad_norm": "1_train/grad_norm", "lr": "1_train/lr", "tokens": "1_train/tokens",
    "tokens_per_sec": "1_train/tokens_per_sec", "mfu": "1_train/mfu", "step_time_s": "1_train/step_time_s",
    "step_work_s": "1_train/step_work_s", "step_work_min_s": "1_train/step_work_min_s",
    "step_work_median_s": "1_train/step_work_median_s",
    "loss_ema": "smoothed/loss_ema", "tokens_per_sec_ema": "smoothed/tokens_per_sec_ema",
    "mfu_ema": "smoothed/mfu_ema", "step_time_s_ema": "smoothed/step_time_s_ema",
    "mem_allocated_bytes": "gpu/mem_allocated_gib", "mem_peak_bytes": "gpu/mem_peak_gib",
    "mem_reserved_bytes": "gpu/mem_reserved_gib", "slowest_rank": "ranks/slowest_rank",
    "n_ranks": "ranks/n_ranks", "attempt": "run/attempt",
    "time/data_s": "time/data_s", "time/fwd_bwd_s": "time/fwd_bwd_s", "eval/loss": "eval/loss",
}


def expected_points(run_dir: str, *, with_ranks: bool = True) -> dict[str, list[tuple[int, float, float]]]:
    """{tag: [(step, wall_time, float32 value)]} computed from the Parquet files with pyarrow."""
    steps = pq.read_table(os.path.join(run_dir, "ingested", "steps.parquet")).to_pylist()
    out: dict[str, list] = {}
    for row in steps:
        for col, v in row.items():
            if col in ("step", "time") or v is None:
                continue
            if col.startswith("mem_"):
                v = v / 2**30
            out.setdefault(TAGS.get(col, col), []).append((row["step"], row["time"], float(np.float32(v))))
    if with_ranks:
        time_of = {r["step"]: r["time"] for r in steps}
        for r in sorted(pq.read_table(os.path.join(run_dir, "ingested", "ranks.parquet")).to_pylist(),
                        key=lambda r: (r["rank"], r["step"])):
            out.setdefault(f"ranks/step_time_s/{r['rank']:05d}", []).append(
                (r["step"], time_of[r["step"]], float(np.float32(r["step_time_s"]))))
    return out


def read_back(path: str) -> dict[str, list[tuple[int, float, float]]]:
    ea = EventAccumulator(path, size_guidance={"scalars": 0})
    ea.Reload()
    # A tag whose every point a SessionLog.START dropped (one the new history no longer has) has no points.
    got = {tag: [(e.step, e.wall_time, e.value) for e in ea.Scalars(tag)] for tag in ea.Tags()["scalars"]}
    return {tag: points for tag, points in got.items() if points}


def same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(
        sa == sb and ta == tb and (va == vb or (math.isnan(va) and math.isnan(vb))) for (sa, ta, va), (sb, tb, vb) in zip(a, b)
    )
