"""Launches that wrote one run at the same time (torchrun killed, its workers orphaned and still
writing while the relaunch ran), and a run folder renamed after recording."""

from __future__ import annotations

import json
import os

import pytest
from findings_fixtures import T0, Clock, close_all, drive, install, open_ranks

from kforge_dash import ingest_run
from kforge_dash.ingest.options import IngestWarning


def _phases(r, s):
    return [("fwd_bwd", 0.1)]


def test_overlapping_launches_are_said_and_not_taken_for_a_restart(tmp_path, monkeypatch):
    clock = install(monkeypatch, Clock(), process_lead_s=5.0)
    run = tmp_path / "orphans"
    a0 = open_ranks(run, 2)
    drive(a0, range(1, 51), clock, phases=_phases)  # T0 .. T0+5
    a1 = open_ranks(run, 2)  # the relaunch, resuming from the step-40 checkpoint, while ...
    for i in range(30):  # ... the orphaned workers of the first launch go on: both write at once
        drive(a0, [51 + i], clock, phases=_phases)
        drive(a1, [41 + i], clock, phases=_phases)
    close_all(a0)
    drive(a1, range(71, 101), clock, phases=_phases)
    close_all(a1)

    with pytest.warns(IngestWarning, match=r"launches 0 and 1 wrote this run at the same time"):
        s = ingest_run(run).summary
    (o,) = s["overlaps"]
    assert (o["attempts"], o["ranks"], o["time"]) == ([0, 1], [0, 1], pytest.approx(T0 + 5.0))
    assert (o["reached_step"], o["first_step"], o["last_step"]) == (50, 51, 80)  # 51-80 ran in both
    assert o["seconds"] == pytest.approx(6.0, abs=1e-3)
    (f,) = [f for f in s["findings"] if f["kind"] == "overlapping_launches"]
    assert (f["first_step"], f["last_step"], f["ranks"], f["severity"]) == (51, 80, [0, 1], "warning")
    ids = [a["attempt_ids"][0] for a in s["attempts"]]
    assert ids[0] in f["message"] and ids[1] in f["message"]
    # what launch 0 had reached when launch 1 started, not what its orphans reached meanwhile
    (r,) = s["restarts"]
    assert (r["resumed_at_step"], r["previous_last_step"], r["superseded_steps"]) == (41, 50, 10)
    (rf,) = [f for f in s["findings"] if f["kind"] == "restart"]
    assert "started while launch 0 still wrote this run (no downtime between them)" in rf["message"]
    assert "10 steps recomputed" in rf["message"] and "0.0 s down" in rf["message"]
    g = s["goodput"]
    assert g["buckets"]["downtime"] == 0.0 and g["wasted_steps"] == 10
    assert g["buckets"]["wasted_progress"] == pytest.approx(1.0, abs=1e-4)  # steps 41-50, before launch 1 began
    assert g["productive_s"] + sum(g["buckets"].values()) == pytest.approx(g["total_s"], abs=1e-6)


def test_a_sequential_restart_is_no_overlap(tmp_path, monkeypatch):
    clock = install(monkeypatch, Clock())
    run = tmp_path / "requeued"
    a0 = open_ranks(run, 2)
    drive(a0, range(1, 21), clock, phases=_phases)
    close_all(a0)
    clock.t += 0.5  # within the clocks' slack: no overlap either
    a1 = open_ranks(run, 2)
    drive(a1, range(11, 31), clock, phases=_phases)
    close_all(a1)
    s = ingest_run(run).summary
    assert s["overlaps"] == [] and not any("same time" in w for w in s["warnings"])
    assert s["restarts"][0]["superseded_steps"] == 10


def test_a_renamed_run_folder_is_the_runs_name(tmp_path, monkeypatch):
    clock = install(monkeypatch, Clock())
    run = tmp_path / "old-name"
    recs = open_ranks(run, 1)
    drive(recs, range(1, 11), clock, phases=_phases)
    close_all(recs)
    assert ingest_run(run).summary["run_name"] == "old-name"
    new = tmp_path / "new-name"
    os.rename(run, new)
    res = ingest_run(new)
    assert not res.skipped and res.summary["run_name"] == "new-name"
    with open(new / "ingested" / "summary.json") as f:
        assert json.load(f)["run_name"] == "new-name"
    assert ingest_run(new).skipped  # and then unchanged again
