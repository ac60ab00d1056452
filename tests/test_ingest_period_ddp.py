"""The job's step time under real DDP (torchrun, gloo, ranks jittered, time between steps): its sum
is the elapsed time from the first step's start to the last step's end within 0.5 % (issue 27.1),
training time stays within the job wall clock, and tokens/s is the Σdt-based figure nanoGPT prints."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from kforge_dash import ingest_run

CHILD = Path(__file__).with_name("period_child.py")
STEPS = 40


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_step_times_add_up_to_the_elapsed_time_under_ddp(tmp_path, world):
    run, out = tmp_path / "ddp", tmp_path / "own"
    out.mkdir()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(world),
           str(CHILD), str(run), str(out), str(STEPS)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    own = [json.loads((out / f"rank-{r}.json").read_text()) for r in range(world)]
    s = ingest_run(run).summary
    steps = pl.read_parquet(run / "ingested" / "steps.parquet")
    total = float(steps["step_time_s"].sum())
    # from the first rank's first start to the last end, on that rank's own clock, as it timed itself
    # (the ranks' mean span would leave out half of the time the others waited for a late starter)
    first = max(own, key=lambda o: o["last_end"] - o["first_start"])
    assert total == pytest.approx(first["last_end"] - first["first_start"], rel=0.005)
    assert s["wall_time_s"] == pytest.approx(total)
    assert s["wall_time_s"] <= s["goodput"]["total_s"]
    # tokens/s as nanoGPT computes it, the tokens over the sum of the dt between iterations: over
    # the run, the first starter's (its first dt holds its wait for the others' start); from step 2 on
    # (the ranks in step after the first all-reduce) rank 0's alone, as nanoGPT's master process prints it
    assert s["mean_tokens_per_sec"] == pytest.approx(STEPS * world * 64 / sum(first["dts"]), rel=0.005)
    later = steps.filter(pl.col("step") > 1)
    # (rank 0's own clock differs from the ranks' mean by where its first and last steps ended among the
    # others': a few ms of a ~1 s job on a loaded machine, so 2 % here; the exact statement is the mean's above)
    assert float(later["tokens"].sum()) / float(later["step_time_s"].sum()) == pytest.approx(
        (STEPS - 1) * world * 64 / sum(own[0]["dts"][1:]), rel=0.02)
    # the time between end_step and start_step (3-9 ms a step) is booked, and as between steps
    # (against the ranks' mean own work: the sum of the per-step max over ranks overstates it under load)
    own_work = pl.read_parquet(run / "ingested" / "ranks.parquet").group_by("rank").agg(pl.col("step_time_s").sum())
    assert total > float(own_work["step_time_s"].mean()) + STEPS * 0.003 * 0.5
    assert s["goodput"]["buckets"]["between_steps"] > STEPS * 0.003 * 0.5
