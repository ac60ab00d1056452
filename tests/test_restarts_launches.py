"""The launches of one run, told apart: an eval logged at the resume step or at step 0 of every launch
supersedes no step of an earlier launch; a launch whose start is unknown follows the known ones by
attempt id."""

import polars as pl
import pytest
from findings_fixtures import Clock, install
from ingest_fixtures import close_all, open_ranks, read_outputs, run_steps
from parts_fixtures import small_run

from kforge_dash.ingest.options import IngestWarning
from kforge_dash.ingest.run import ingest_run


def _two_launches(run, monkeypatch, *, log0=None, log1=None):
    """Launch 0 ends steps 1..20 (loss = step), launch 1 ends 21..30 (loss = 100 + step); each may
    first call Recorder.log(step, **scalars) with ``log0``/``log1`` = (step, scalars)."""
    clock = install(monkeypatch, Clock())  # step times and end times on one clock: the period is the step time
    a0 = open_ranks(run, 1)
    if log0:
        a0[0].log(log0[0], **log0[1])
    run_steps(monkeypatch, a0, range(1, 21), step_time=lambda r, s: 1.0,
              values=lambda r, s: {"loss": float(s), "tokens": 10}, clock=clock)
    close_all(a0)
    a1 = open_ranks(run, 1)
    if log1:
        a1[0].log(log1[0], **log1[1])
    run_steps(monkeypatch, a1, range(21, 31), step_time=lambda r, s: 2.0,
              values=lambda r, s: {"loss": 100.0 + s, "tokens": 10}, clock=clock)
    close_all(a1)


def _check_no_step_lost(steps, summary):
    ended = steps.filter(pl.col("step_time_s").is_not_null())
    assert ended["step"].to_list() == list(range(1, 31))
    assert ended["attempt"].to_list() == [0] * 20 + [1] * 10
    assert ended["loss"].to_list() == [float(s) for s in range(1, 21)] + [100.0 + s for s in range(21, 31)]
    assert summary["tokens"] == 30 * 10 and summary["wall_time_s"] == 20 * 1.0 + 10 * 2.0
    assert summary["restarts"] == [{"attempt": 1, "resumed_at_step": 21, "previous_last_step": 20,
                                    "superseded_steps": 0, "time": summary["attempts"][1]["start_time"],
                                    "in_process": False, "why": "relaunch"}]


def test_an_eval_logged_at_the_resume_step_does_not_supersede_it(tmp_path, monkeypatch):
    run = str(tmp_path / "resume_eval")
    _two_launches(run, monkeypatch, log1=(20, {"eval/loss": 0.5}))  # eval of the checkpoint at 20
    ingest_run(run)
    steps, ranks, summary = read_outputs(run)
    _check_no_step_lost(steps, summary)
    assert steps.height == 30 and ranks.height == 30
    row = steps.row(19, named=True)
    assert (row["step"], row["attempt"], row["loss"], row["eval/loss"]) == (20, 0, 20.0, 0.5)


def test_a_log_at_step_0_of_every_launch_does_not_drop_earlier_launches(tmp_path, monkeypatch):
    run = str(tmp_path / "log0")
    _two_launches(run, monkeypatch, log0=(0, {"setup/params_m": 7.0}), log1=(0, {"setup/params_m": 8.0}))
    with pytest.warns(IngestWarning, match="'setup/params_m' logged with different values"):
        ingest_run(run)
    steps, ranks, summary = read_outputs(run)
    _check_no_step_lost(steps, summary)
    assert steps["step"].to_list() == list(range(0, 31)) and ranks.height == 31
    assert steps.row(0, named=True)["setup/params_m"] == 8.0  # the later launch's value
    assert [(a["first_step"], a["last_step"]) for a in summary["attempts"]] == [(1, 20), (21, 30)]


def test_an_unknown_start_is_none_and_ordered_last_by_attempt_id(tmp_path, monkeypatch):
    import dataclasses

    from kforge_dash.ingest.inputs import shards as shards
    from kforge_dash.ingest.inputs.launches import group_launches

    run = str(tmp_path / "starts")
    for _ in range(3):  # three launches of one rank
        small_run(run, monkeypatch, world=1)
    w = []
    got = [shards.read_attempt(af, w) for af in shards.list_attempts(run, w)]
    assert all(a.start_time is not None for a in got) and not w
    # the two later launches lose their start: they follow the known one, by attempt id
    unknown = [dataclasses.replace(a, start_time=None) for a in got[1:]]
    launches = group_launches([unknown[1], got[0], unknown[0]], w)
    assert [[a.attempt_id for a in L.attempts] for L in launches] == [[a.attempt_id] for a in got]
