"""End to end over sample_runs/ (real training runs from examples/): a copy is ingested in tmp_path."""

import glob
import json
import math
import os
import shutil

import polars as pl
import pytest
from click.testing import CliRunner

from kforge_dash.cli.ingest import main

SAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "sample_runs")


def sample_runs():
    return sorted(d for d in glob.glob(os.path.join(SAMPLES, "*")) if glob.glob(os.path.join(d, "rank-*", "*", "part-*.parquet")))


def test_ingest_sample_runs_end_to_end(tmp_path):
    assert sample_runs(), f"{SAMPLES} holds no recorded runs (python examples/make_sample_runs.py makes them)"
    root = tmp_path / "runs"
    for d in sample_runs():
        shutil.copytree(d, root / os.path.basename(d), ignore=shutil.ignore_patterns("ingested"))
    r = CliRunner().invoke(main, [str(root), "--json", "--no-tensorboard", "--no-wandb"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["failed"] == [] and len(out["runs"]) == len(sample_runs())
    for run in out["runs"]:
        d, s = run["run_dir"], run["summary"]
        raw = pl.concat([pl.read_parquet(p, columns=["step", "step_time_s"])
                         for p in glob.glob(os.path.join(d, "rank-*", "*", "part-*.parquet"))])
        steps = pl.read_parquet(os.path.join(d, "ingested", "steps.parquet"))
        ranks = pl.read_parquet(os.path.join(d, "ingested", "ranks.parquet"))
        # every step any rank ended shows up once, sorted; one row per (rank, step)
        ended = sorted(raw.filter(pl.col("step_time_s").is_not_null())["step"].unique().to_list())
        assert set(ended) <= set(steps["step"].to_list())
        assert steps["step"].to_list() == sorted(steps["step"].to_list())
        assert ranks.select("rank", "step").is_duplicated().sum() == 0
        assert s["steps"] == steps.height and s["world_size"] >= 1
        # tokens/s is tokens over the slowest rank's step time, step by step
        both = steps.drop_nulls(["tokens", "step_time_s"])
        assert both["tokens_per_sec"].to_list() == pytest.approx((both["tokens"] / both["step_time_s"]).to_list())
        # a NaN recorded as loss is still there
        nan_steps = sum(1 for v in steps["loss"].to_list() if v is not None and not math.isfinite(v))
        assert s["nonfinite"]["loss"] == nan_steps
        if len(s["attempts"]) > 1:  # a preempted run: restarts reported, latest attempt wins
            for rs in s["restarts"]:
                later = steps.filter(pl.col("step") >= rs["resumed_at_step"])
                assert later["attempt"].min() >= rs["attempt"]
