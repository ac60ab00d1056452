"""The per-step facts over ranks are the same through numpy matrices and through polars' group-by."""

from __future__ import annotations

import os

import polars as pl
import pytest
from findings_fixtures import Clock, close_all, drive, install, open_ranks

from kforge_dash import ingest_run
from kforge_dash.ingest.findings import perstep
from kforge_dash.ingest.findings.matrix import Window
from kforge_dash.ingest.findings.model import RunFacts, classify_phases
from kforge_dash.ingest.findings.options import FindingsOptions


def _window(run_dir):
    out = os.path.join(run_dir, "ingested")
    steps = pl.read_parquet(os.path.join(out, "steps.parquet"))
    o = FindingsOptions()
    facts = RunFacts(steps=steps, ranks_path=os.path.join(out, "ranks.parquet"), launches=[], summary={}, opts=o,
                     phases=classify_phases(steps.columns, o))
    ph = facts.phases
    lf = pl.scan_parquet(facts.ranks_path).filter(pl.col("step_time_s").is_not_null()).select(
        "step", "rank", "attempt", "step_time_s", *ph.own, perstep.own_work(ph.own).alias("_own"),
        perstep.own_work(ph.data).alias("_data"), perstep.own_work(ph.checkpoint).alias("_ckpt"),
        perstep.own_work(ph.eval).alias("_eval"), perstep.own_work(ph.wait).fill_null(0.0).alias("_wait"))
    st = steps.select("step", pl.col("step_time_median_s").alias("_st"))
    return lf.collect(), ph, st


def test_matrix_and_group_by_agree(tmp_path, monkeypatch):
    clock = install(monkeypatch, Clock())
    recs = open_ranks(tmp_path / "r", 4)

    def phases(r, s):  # rank 3 slow to load; rank 0 checkpoints every 10 steps; ties in the wait
        ph = [("data", 0.01 + (0.02 if r == 3 else 0.0) + 0.001 * ((r * 7 + s) % 5)), ("optimizer", 0.005)]
        return ph + ([("checkpoint", 0.1)] if r == 0 and s % 10 == 0 else [])

    drive(recs, range(1, 61), clock, phases=phases)
    close_all(recs)
    ingest_run(recs[0].run_dir)
    df, ph, st = _window(recs[0].run_dir)
    win = Window.of(df)
    fast = win.per_step(ph.own, ph.data)
    slow = perstep._grouped(df.lazy(), ph)
    assert fast is not None and fast.select(slow.columns).equals(slow)
    assert fast["ckpt_max"].null_count() == 54  # null where no rank checkpointed, never 0.0
    assert fast.filter(pl.col("step") == 10)["ckpt_max"].item() == pytest.approx(0.1)
    # no eval phase timed (a column null throughout, never gathered): null, and the critical rank's
    # side work is its checkpoint alone
    assert fast["eval_max"].null_count() == 60 and fast["crit_side"].null_count() == 0
    # straggler blocks: the same (sums may differ in the last bit: another order of additions)
    W = 5
    fb = win.blocks(fast, fast.join(st, on="step")["_st"].to_numpy(), ph.own, W)
    sb = perstep._blocks_grouped(df, slow.join(st, on="step"), ph.own, W).sort("rank", "_block")
    fb = fb.select(sb.columns).sort("rank", "_block")
    assert fb.schema == sb.schema and fb.height == sb.height == 4 * 13  # steps 1-4, 5-9, ..., 55-59, 60
    for c in fb.columns:
        assert fb[c].to_list() == pytest.approx(sb[c].to_list(), rel=1e-12, abs=1e-15), c
    assert fb.filter(pl.col("rank") == 3)["time/data_s\0ex"].min() > 0.015  # rank 3's slow loader
    # a step without one of the ranks is not a matrix: the group-by way takes it
    assert Window.of(df.filter(~((pl.col("step") == 5) & (pl.col("rank") == 2)))) is None
