"""Steps recorded more than once (an in-process rollback: a restart, test_restarts_rollback.py; a duplicate
end_step: the last row kept, with a warning) and log rows with no ended step (a log-only window, a log-only run)."""

import polars as pl
import pytest
from findings_fixtures import Clock, install
from ingest_fixtures import close_all, open_ranks, read_outputs, run_steps

from kforge_dash.ingest.options import IngestOptions
from kforge_dash.ingest.run import ingest_run
from kforge_dash.pipeline import ingest_path


def test_a_window_of_log_rows_only_is_ingested(tmp_path, monkeypatch):
    run = str(tmp_path / "logtail")
    clock = install(monkeypatch, Clock())  # step times and end times on one clock: the period is the step time
    recs = open_ranks(run, 1, flush_every_steps=1000)
    run_steps(monkeypatch, recs, range(1, 11), step_time=lambda r, s: 1.0,
              values=lambda r, s: {"loss": float(s), "tokens": 10}, flush_every=5, clock=clock)
    recs[0].log(11, eval_loss=0.5)  # a final eval, past the last ended step: its own part file
    close_all(recs)
    ingest_run(run, options=IngestOptions(chunk_rows=5))  # windows [1,6) [6,11) [11,12): the last holds the log row only
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


@pytest.mark.parametrize("chunk_rows", [4_000_000, 5])
def test_an_in_process_rollback_keeps_the_last_row_of_each_step(tmp_path, monkeypatch, chunk_rows):
    """Steps 1..10, then the process reloads the checkpoint of step 5 and redoes 6..12."""
    run = str(tmp_path / "rollback")
    recs = open_ranks(run, 2)
    calls = {0: 0, 1: 0}  # per rank: end_step calls so far (the first 10 are the first pass)

    def values(r, s):
        calls[r] += 1
        return {"loss": (0.0 if calls[r] <= 10 else 100.0) + s, "tokens": 10}

    # step_time is asked just before values, so calls[r] still counts the earlier steps there
    run_steps(monkeypatch, recs, list(range(1, 11)) + list(range(6, 13)), values=values,
              step_time=lambda r, s: 1.0 if calls[r] < 10 else 2.0)
    close_all(recs)
    out = ingest_path(run, tensorboard=True, wandb=False, chunk_rows=chunk_rows)[0]
    steps, ranks, summary = read_outputs(run)
    assert steps["step"].to_list() == list(range(1, 13))
    assert steps["loss"].to_list() == [float(s) for s in range(1, 6)] + [100.0 + s for s in range(6, 13)]
    assert steps["tokens"].to_list() == [20] * 12 and summary["tokens"] == 12 * 20
    assert steps["step_work_s"].to_list() == [1.0] * 5 + [2.0] * 7  # each step's kept rows' own times
    assert ranks.height == 24 and steps["n_ranks"].to_list() == [2] * 12
    for r in (0, 1):
        assert ranks.filter(pl.col("rank") == r)["step"].to_list() == list(range(1, 13))
    assert not [w for w in summary["warnings"] if "recorded more than once" in w]  # a rollback: a restart
    (restart,) = summary["restarts"]
    assert (restart["resumed_at_step"], restart["previous_last_step"], restart["why"]) == (6, 10, "rollback")
    assert out.summary["exports"]["tensorboard"]["ok"] is True  # steps strictly increase


def test_a_rollback_that_redoes_only_some_steps_supersedes_the_rest(tmp_path, monkeypatch):
    run = str(tmp_path / "partial")
    recs = open_ranks(run, 1)
    n = [0]

    def values(r, s):
        n[0] += 1
        return {"loss": (0.0 if n[0] <= 10 else 100.0) + s, "tokens": 10}

    run_steps(monkeypatch, recs, list(range(1, 11)) + [3, 4, 5], step_time=lambda r, s: 1.0, values=values)
    close_all(recs)
    ingest_run(run)
    steps, ranks, summary = read_outputs(run)
    want = [1.0, 2.0, 103.0, 104.0, 105.0]
    assert steps["loss"].to_list() == want and ranks["loss"].to_list() == want
    assert ranks["step"].to_list() == list(range(1, 6)) and summary["tokens"] == 50
    # a rollback to step 3 from step 10 (steps 6-10 of the first pass superseded too, though no later row ended them)
    assert [(r["resumed_at_step"], r["previous_last_step"], r["superseded_steps"]) for r in summary["restarts"]] == [(3, 10, 8)]
    assert not [w for w in summary["warnings"] if "recorded more than once" in w]


def test_duplicate_end_step_keeps_the_last_with_a_warning(tmp_path, monkeypatch):
    run = str(tmp_path / "dup")
    recs = open_ranks(run, 1)
    run_steps(monkeypatch, recs, [1, 2, 2, 3], step_time=lambda r, s: 1.0,
              values=lambda r, s: {"loss": float(s), "tokens": 10})
    close_all(recs)
    with pytest.warns(UserWarning, match="recorded more than once"):
        ingest_run(run)
    steps, ranks, _ = read_outputs(run)
    assert ranks.height == 3 and steps["tokens"].to_list() == [10, 10, 10]
