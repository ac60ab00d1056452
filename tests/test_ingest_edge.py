"""Edge cases found in review: log rows vs restarts, rollbacks inside one attempt, log-only
windows, stray attempt folders, export fallbacks. Shards come from the real Recorder."""

import os

import polars as pl
import pytest

import kforge_dash.ingest as ingest_mod
from kforge_dash.ingest import ingest_path, ingest_run

from ingest_fixtures import close_all, open_ranks, read_outputs, run_steps


def test_a_window_of_log_rows_only_is_ingested(tmp_path, monkeypatch):
    run = str(tmp_path / "logtail")
    recs = open_ranks(run, 1, flush_every_steps=1000)
    run_steps(monkeypatch, recs, range(1, 11), step_time=lambda r, s: 1.0,
              values=lambda r, s: {"loss": float(s), "tokens": 10}, flush_every=5)
    recs[0].log(11, eval_loss=0.5)  # a final eval, past the last ended step: its own part file
    close_all(recs)
    ingest_run(run, chunk_rows=5)  # windows [1,6) [6,11) [11,12): the last holds the log row only
    steps, ranks, summary = read_outputs(run)
    assert steps["step"].to_list() == list(range(1, 12))
    last = steps.row(10, named=True)
    assert last["eval_loss"] == 0.5 and last["step_time_s"] is None and last["tokens"] is None
    assert steps["eval_loss"].null_count() == 10
    assert summary["tokens"] == 10 * 10 and summary["wall_time_s"] == 10 * 1.0
    assert ranks.height == 11


def test_a_run_of_log_rows_only_is_ingested(tmp_path, monkeypatch):
    run = str(tmp_path / "logonly")
    recs = open_ranks(run, 1)
    recs[0].log(10, eval_loss=1.5)  # e.g. an eval-only process
    close_all(recs)
    ingest_run(run)
    steps, _, summary = read_outputs(run)
    assert steps["step"].to_list() == [10] and steps["eval_loss"].to_list() == [1.5]
    assert summary["tokens"] is None and summary["wall_time_s"] is None


def test_an_unexpected_error_in_one_run_does_not_stop_the_others(tmp_path, monkeypatch):
    root = tmp_path / "root"
    for name in ("a", "b"):
        recs = open_ranks(str(root / name), 1)
        run_steps(monkeypatch, recs, range(1, 6), step_time=lambda r, s: 1.0)
        close_all(recs)
    real = ingest_mod._ingest_locked

    def buggy(run_dir, *a):  # a bug of ours that run "a" hits
        if run_dir == str(root / "a"):
            raise TypeError("'>=' not supported between instances of 'NoneType' and 'int'")
        return real(run_dir, *a)

    monkeypatch.setattr(ingest_mod, "_ingest_locked", buggy)
    out = ingest_path(str(root), tensorboard=False, wandb=False)
    by_name = {os.path.basename(r.run_dir): r for r in out}
    assert by_name["b"].summary["steps"] == 5
    err = by_name["a"].error
    assert str(root / "a") in err and "TypeError" in err and "NoneType" in err
