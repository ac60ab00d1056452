"""Recorder.log(step, loss=, grad_norm=, lr=, tokens=) fills a step that already ended (what a
framework callback does: the step's time at its end, the loss only at the framework's log hook)."""

from __future__ import annotations

import polars as pl
import pytest
import torch
from ingest_fixtures import flush_all, open_ranks, run_steps

from kforge_dash import IngestOptions, ingest_run


def _steps(run):
    return pl.read_parquet(f"{run}/ingested/steps.parquet")


@pytest.mark.parametrize("chunk_rows", [5, 100_000])  # log rows in the window of their step, or windows cut often
def test_log_fills_loss_grad_norm_lr_tokens_of_an_ended_step(tmp_path, monkeypatch, chunk_rows):
    run = str(tmp_path / "run")
    recs = open_ranks(run, 2)

    def later(r, s):
        return {}  # end_step knows only the time: the values come after, as from a framework's on_log

    run_steps(monkeypatch, recs, range(1, 21), step_time=lambda r, s: 0.5, values=later)
    for s in range(1, 21):
        for r, rec in recs.items():
            rec.log(s, loss=torch.tensor(1.0 / s + r), grad_norm=2.0 * s, lr=1e-3 * s, tokens=100 + r)
    for rec in recs.values():
        rec.close()
    res = ingest_run(run, options=IngestOptions(chunk_rows=chunk_rows))
    df = _steps(run)
    assert df["step"].to_list() == list(range(1, 21))
    assert df["step_work_s"].to_list() == [0.5] * 20  # one row per step: the log rows were folded in
    assert df["loss"].to_list() == pytest.approx([1.0 / s + 0.5 for s in range(1, 21)])
    assert df["grad_norm"].to_list() == [2.0 * s for s in range(1, 21)]
    assert df["lr"].to_list() == pytest.approx([1e-3 * s for s in range(1, 21)])
    assert df["tokens"].to_list() == [201] * 20
    assert df["tokens_per_sec"].to_list() == pytest.approx((201 / df["step_time_s"]).to_list())
    assert not [w for w in res.summary["warnings"] if "logged" in w or "given by both" in w]


def test_a_value_given_twice_keeps_end_step_then_the_last_log_with_a_warning(tmp_path, monkeypatch):
    run = str(tmp_path / "run")
    recs = open_ranks(run, 1)
    run_steps(monkeypatch, recs, range(1, 11), step_time=lambda r, s: 0.1,
              values=lambda r, s: {"loss": 5.0} if s == 3 else {})
    rec = recs[0]
    rec.log(3, loss=7.0)              # clashes with end_step's 5.0: end_step wins
    rec.log(4, lr=0.1)
    rec.log(4, lr=0.2)                # logged twice: the last wins
    rec.log(5, grad_norm=1.0)
    rec.log(5, grad_norm=1.0)         # the same value twice is no clash
    flush_all(recs)
    rec.close()
    with pytest.warns(Warning) as got:
        res = ingest_run(run)
    df = _steps(run).filter(pl.col("step").is_in([3, 4, 5]))
    assert df["loss"].to_list()[0] == 5.0 and df["lr"].to_list()[1] == 0.2 and df["grad_norm"].to_list()[2] == 1.0
    ws = res.summary["warnings"]
    assert [w for w in ws if "'loss' given by both end_step and log" in w and "end_step value kept" in w
            and "for 1 (rank, step)" in w]
    assert [w for w in ws if "'lr' logged with different values" in w and "last logged kept" in w]
    assert not [w for w in ws if "grad_norm" in w]
    assert any("'loss' given by both" in str(w.message) for w in got)


def test_log_values_added_by_a_later_part_are_appended(tmp_path, monkeypatch):
    """A running job: end_step rows in one part, their loss in the next (a live --watch ingest)."""
    run = str(tmp_path / "run")
    recs = open_ranks(run, 1)
    run_steps(monkeypatch, recs, range(1, 8), step_time=lambda r, s: 0.1, values=lambda r, s: {})
    flush_all(recs)
    ingest_run(run)
    for s in range(1, 8):
        recs[0].log(s, loss=float(s))
    recs[0].close()
    res = ingest_run(run)
    assert res.appended and _steps(run)["loss"].to_list() == [float(s) for s in range(1, 8)]
    full = ingest_run(run, options=IngestOptions(force=True))
    assert full.summary["final_loss"] == res.summary["final_loss"] == 7.0
