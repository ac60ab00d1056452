"""Goodput of a preempted and resumed run, on a known timeline: every bucket, and they add up."""

from __future__ import annotations

import pytest
from findings_fixtures import T0, Clock, close_all, drive, install, open_ranks

from kforge_dash import ingest_run

LEAD = 5.0  # each process starts 5 s before its Recorder (imports, model, process group)


def _phases(r, s):
    ph = [("data", 0.01), ("fwd_bwd", 2.0 if s == 1 else 0.09)]  # step 1 compiles: warm-up
    if r == 0 and s % 50 == 0:
        ph.append(("checkpoint", 0.5))  # rank 0 saves; rank 1 waits for it in its all-reduce
    return ph


def _evals(s):
    return 1.0 if s % 50 == 0 else 0.0  # an eval between steps every 50 steps


def _preempted(tmp_path, monkeypatch):
    clock = install(monkeypatch, Clock(), process_lead_s=LEAD)
    run = tmp_path / "preempted"
    a0 = open_ranks(run, 2)
    drive(a0, range(1, 131), clock, phases=_phases, after=_evals, log=lambda r, s: {"eval/loss": 1.0} if s % 50 == 0 else None)
    close_all(a0)  # SIGTERM after step 130: the last checkpoint is step 100
    clock.t += 30.0  # requeued: the next processes start 25 s later, their Recorders 5 s after that
    a1 = open_ranks(run, 2)
    drive(a1, range(101, 251), clock, phases=_phases, after=_evals,
          log=lambda r, s: {"eval/loss": 1.0} if s % 50 == 0 else None)
    close_all(a1)
    return ingest_run(run).summary, clock.t


def test_goodput_buckets_of_a_resumed_run(tmp_path, monkeypatch):
    s, end = _preempted(tmp_path, monkeypatch)
    g = s["goodput"]
    b = g["buckets"]
    assert g["total_s"] == pytest.approx(end - (T0 - LEAD), abs=1e-4)
    assert g["productive_s"] + sum(b.values()) == pytest.approx(g["total_s"], abs=1e-6)
    assert g["fraction"] == pytest.approx(g["productive_s"] / g["total_s"])
    # the resumed run's wasted steps are exactly the recomputed ones
    assert g["wasted_steps"] == s["restarts"][0]["superseded_steps"] == 30
    expect = {
        "startup": 2 * LEAD,
        "downtime": 30.0 - LEAD,
        "wasted_progress": 30 * 0.1 + 1.0,  # steps 101-130 of the first launch and the eval after step 100
        "checkpoint": 5 * 0.5,  # steps 50, 100 (kept), 150, 200, 250
        "eval": 4 * 1.0,  # after steps 50, 150, 200 and 250 (the last, before the processes exit)
        "warmup": 2.0 - 0.09,  # step 1 over the launch's median step
        "data_stall": 250 * 0.01,  # the median rank's data phase in every kept step
        "straggler_wait": 0.0,  # both ranks do the same own work (a checkpoint is not straggling)
        "between_steps": 0.0,  # the evals after steps 50, 150, 200 are "eval"; nothing else between steps
        "other": 0.0,
    }
    assert b == pytest.approx(expect, abs=1e-3)
    assert g["productive_s"] == pytest.approx(250 * 0.09, abs=1e-3)  # the fwd_bwd of every kept step
    per = g["per_attempt"]
    assert [a["attempt"] for a in per] == [0, 1] and [a["wasted_steps"] for a in per] == [30, 0]
    assert sum(a["total_s"] for a in per) == pytest.approx(g["total_s"], abs=1e-6)
    for a in per:
        assert a["productive_s"] + sum(a["buckets"].values()) == pytest.approx(a["total_s"], abs=1e-6)
    assert per[1]["buckets"]["downtime"] == pytest.approx(25.0, abs=1e-4)
    (f,) = [f for f in s["findings"] if f["kind"] == "restart"]
    assert (f["first_step"], f["last_step"], f["ranks"], f["severity"]) == (101, 130, [0, 1], "info")
    assert "30 steps recomputed (4.0 s of wasted progress) and 25.0 s down" in f["message"]
    # rank 1 waited for rank 0's checkpoints in its all-reduce: not a straggler, nor is rank 0
    assert [f for f in s["findings"] if f["kind"] == "straggler"] == []


def test_meta_json_has_the_process_start(tmp_path):
    """A process that spends 1 s before building its Recorder: meta.json's process_start_time is
    that much before start_time (goodput counts it as startup, not downtime)."""
    import json
    import subprocess
    import sys

    code = ("import time; time.sleep(1.0); from kforge_record import Recorder; "
            f"r = Recorder({str(tmp_path / 'run')!r}, rank=0, world_size=1); r.end_step(1, loss=1.0); r.close()")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    (meta,) = (tmp_path / "run").glob("rank-00000/*/meta.json")
    m = json.loads(meta.read_text())
    assert 1.0 <= m["start_time"] - m["process_start_time"] < 30.0
