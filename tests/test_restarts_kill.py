"""A job SIGKILLed after its last flush and resumed from an older checkpoint: ingest tells exactly
how far it got (the heartbeat), what was recomputed and which steps were trained but not recorded."""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys

import polars as pl
import pytest
from findings_fixtures import T0

from kforge_dash import ingest_run, text
from kforge_dash.ingest.options import IngestWarning

HERE = os.path.dirname(os.path.abspath(__file__))
STEP_S = 0.1


def _launch(run, t_start, first, last, flush_at, kill) -> float:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")])}
    p = subprocess.run([sys.executable, os.path.join(HERE, "kill_child.py"), str(run), repr(t_start), str(first),
                        str(last), str(flush_at), "1" if kill else "0"], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == (-signal.SIGKILL if kill else 0), p.stderr
    return float(p.stdout.split("clock ")[1])


def test_kill_after_the_last_flush_then_resume(tmp_path):
    """Killed after step 140 with rows flushed to step 92, resumed from the step-100 checkpoint."""
    run = tmp_path / "killed"
    killed_at = _launch(run, T0, 1, 140, 92, kill=True)
    assert killed_at == pytest.approx(T0 + 140 * STEP_S)
    beats = sorted(run.glob("rank-*/*/heartbeat.bin"))
    assert len(beats) == 2  # one per rank, in its attempt folder; read as docs/CONTRACT.md lays it out:
    for b in beats:
        data = b.read_bytes()
        assert len(data) == 24 and data[:4] == b"KFHB" and struct.unpack_from("<I", data, 4) == (1,)
        step, t = struct.unpack_from("<qd", data, 8)
        assert step == 140 and t == pytest.approx(killed_at)  # the SIGKILL kept the last store
    _launch(run, killed_at + 30.0, 101, 200, 0, kill=False)  # requeued: processes 25 s later, Recorders 5 s after

    with pytest.warns(IngestWarning, match=r"steps 93–100 were trained but not recorded"):
        s = ingest_run(run).summary
    steps = pl.read_parquet(run / "ingested" / "steps.parquet")["step"].to_list()
    assert steps == list(range(1, 93)) + list(range(101, 201))  # the hole is there ...
    assert s["attempts"][0]["last_step"] == 92 and s["attempts"][0]["reached_step"] == 140
    (r,) = s["restarts"]
    assert (r["resumed_at_step"], r["previous_last_step"], r["superseded_steps"]) == (101, 140, 40)
    assert s["unrecorded"] == [{"attempt": 0, "first_step": 93, "last_step": 100, "reached_step": 140,  # ... and said
                                "recorded_step": 92, "ranks": [0, 1], "killed": True}]
    assert any("steps 93–100 were trained but not recorded" in w for w in s["warnings"])

    (u,) = [f for f in s["findings"] if f["kind"] == "unrecorded_steps"]
    assert (u["first_step"], u["last_step"], u["ranks"], u["severity"], u["score"]) == (93, 100, [0, 1], "warning", 8)
    steps = text.step_range(93, 100).capitalize()  # "Steps 93–100", as every front end writes a range
    assert f"{steps} were trained by launch 0 but not recorded" in u["message"]
    (f,) = [f for f in s["findings"] if f["kind"] == "restart"]
    assert (f["first_step"], f["last_step"]) == (101, 140)
    # 101-140 ran for 4.0 s before the kill: wasted progress, not downtime; down: 30 s less the 5 s startup
    assert "reached step 140: 40 steps recomputed (4.0 s of wasted progress) and 25.0 s down" in f["message"]

    g = s["goodput"]
    assert g["wasted_steps"] == 40
    assert g["buckets"]["wasted_progress"] == pytest.approx(40 * STEP_S, abs=1e-4)
    assert g["buckets"]["downtime"] == pytest.approx(25.0, abs=1e-4)
    assert g["buckets"]["startup"] == pytest.approx(10.0, abs=1e-4)
    # productive: every kept step, and steps 93-100 (trained, kept by the checkpoint, not recorded)
    assert g["productive_s"] == pytest.approx((92 + 8 + 100) * STEP_S, abs=1e-4)
    assert g["productive_s"] + sum(g["buckets"].values()) == pytest.approx(g["total_s"], abs=1e-4)


def test_kill_of_the_last_launch_is_told_once_its_process_is_gone(tmp_path):
    """No relaunch: the heartbeat of the killed (gone) process says how far it got past its rows."""
    run = tmp_path / "killed-last"
    _launch(run, T0, 1, 57, 40, kill=True)
    with pytest.warns(IngestWarning, match=r"steps 41–57 were trained but not recorded"):
        s = ingest_run(run).summary
    assert s["unrecorded"][0]["first_step"] == 41 and s["unrecorded"][0]["last_step"] == 57
    assert s["restarts"] == [] and s["goodput"]["productive_s"] == pytest.approx(57 * STEP_S, abs=1e-4)


def test_a_kill_after_the_last_ingest_is_told_by_the_next(tmp_path):
    """Ingested while it ran (its heartbeat ahead of its rows by the unflushed window: no loss),
    then killed with no file changed: the next ingest sees the kill, not an unchanged run."""
    run = tmp_path / "watched"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, os.path.join(HERE, "kill_child.py"), str(run), repr(T0), "1", "57", "40",
                             "1", "50"], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "paused"
        live = ingest_run(run).summary  # the job runs: steps 41-50 are only not flushed yet
        assert live["attempts"][0]["reached_step"] == 50 and live["unrecorded"] == []
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.wait(timeout=60) == -signal.SIGKILL
    finally:
        proc.kill()
    with pytest.warns(IngestWarning, match=r"steps 41–57 were trained but not recorded"):
        res = ingest_run(run)
    assert not res.skipped and res.summary["unrecorded"][0]["last_step"] == 57
    assert ingest_run(run).skipped  # told once: unchanged from then on


def test_a_damaged_heartbeat_is_said_and_the_run_ingested(tmp_path):
    from kforge_record import Recorder
    from kforge_record.check import check_run

    rec = Recorder(tmp_path / "run", rank=0, world_size=1, install_sigterm_handler=False)
    for s in range(1, 6):
        rec.end_step(s, loss=1.0)
    rec.close()
    assert check_run(tmp_path / "run") == []
    (beat,) = (tmp_path / "run").glob("rank-*/*/heartbeat.bin")
    beat.write_bytes(beat.read_bytes()[:10])  # cut short
    (problem,) = check_run(tmp_path / "run")
    assert "heartbeat.bin" in problem and "10 bytes" in problem
    with pytest.warns(IngestWarning, match=r"heartbeat\.bin: unreadable"):
        s = ingest_run(tmp_path / "run").summary
    assert s["steps"] == 5 and s["attempts"][0]["reached_step"] == 5 and s["unrecorded"] == []


def test_steps_ended_after_close_are_trained_not_recorded_and_not_a_kill(tmp_path):
    from kforge_record import Recorder

    rec = Recorder(tmp_path / "run", rank=0, world_size=1, install_sigterm_handler=False)
    for s in range(1, 6):
        rec.end_step(s, loss=1.0)
    rec.close()
    rec.end_step(6, loss=1.0)  # the loop went on after close(): not recorded, but the heartbeat knows
    with pytest.warns(IngestWarning, match=r"step 6 was trained but not recorded \(it closed cleanly"):
        s = ingest_run(tmp_path / "run").summary
    assert s["unrecorded"] == [{"attempt": 0, "first_step": 6, "last_step": 6, "reached_step": 6, "recorded_step": 5,
                                "ranks": [0], "killed": False}]
    (f,) = [f for f in s["findings"] if f["kind"] == "unrecorded_steps"]
    assert f["message"].startswith("Step 6 was trained by launch 0 but not recorded")
    assert "it closed cleanly" in f["message"] and "killed" not in f["message"]


def test_a_kill_whose_lost_rows_were_all_recomputed_leaves_no_hole(tmp_path):
    """Rows flushed to step 120, killed after 140, resumed at 101: 101-140 recomputed (rows 101-120
    superseded, 121-140 known from the heartbeat), nothing trained but not recorded."""
    run = tmp_path / "killed"
    killed_at = _launch(run, T0, 1, 140, 120, kill=True)
    _launch(run, killed_at + 30.0, 101, 200, 0, kill=False)
    s = ingest_run(run).summary
    (r,) = s["restarts"]
    assert (r["resumed_at_step"], r["previous_last_step"], r["superseded_steps"]) == (101, 140, 40)
    assert s["unrecorded"] == [] and not any("not recorded" in w for w in s["warnings"])
    g = s["goodput"]
    assert g["wasted_steps"] == 40 and g["buckets"]["wasted_progress"] == pytest.approx(40 * STEP_S, abs=1e-4)
    assert g["buckets"]["downtime"] == pytest.approx(25.0, abs=1e-4)


@pytest.mark.parametrize("body", [(2**63 - 1, float("nan")), (10**12, float("inf")), (140, -1e9), (10**12, None)],
                         ids=["nan-time", "inf-time", "before-start", "step-far-past-rows"])
def test_an_impossible_heartbeat_is_ignored_with_a_warning_naming_it(tmp_path, body):
    """Right size, magic and layout, impossible body: the launch's reach comes from its rows and the
    file is named in a warning (issue 32.1)."""
    run = tmp_path / "bad-beat"
    killed_at = _launch(run, T0, 1, 140, 92, kill=True)
    _launch(run, killed_at + 30.0, 101, 200, 0, kill=False)
    beats = sorted(run.glob("rank-*/*/heartbeat.bin"))[:1]  # rank 0 of launch 0 (attempt ids sort by start)
    rank1 = sorted(run.glob("rank-00001/*/heartbeat.bin"))[0]
    rank1.write_bytes(rank1.read_bytes()[:8] + struct.pack("<qd", 92, killed_at - 4.8))  # rank 1 stopped at its rows
    step, t = body
    beats[0].write_bytes(beats[0].read_bytes()[:8] + struct.pack("<qd", step, killed_at if t is None else t))
    with pytest.warns(IngestWarning):
        s = ingest_run(run).summary
    assert s["attempts"][0]["reached_step"] == 92  # its rows; not 9.2e18
    (r,) = s["restarts"]
    assert (r["previous_last_step"], r["superseded_steps"]) == (92, 0)
    assert s["goodput"]["wasted_steps"] == 0
    (w,) = [w for w in s["warnings"] if str(beats[0]) in w]
    assert "impossible heartbeat" in w and "ignored" in w
    assert not any("recomputed" in w and "1000000000000" in w for w in s["warnings"])


def test_an_impossible_heartbeat_is_no_kill_to_re_ingest_for(tmp_path):
    """A kill changes no file, so ingest re-reads a run whose heartbeats moved past the reached step;
    a heartbeat that cannot be (ingest ignores it) must not make every pass a full re-ingest."""
    run = tmp_path / "killed-last"
    killed_at = _launch(run, T0, 1, 57, 40, kill=True)
    with pytest.warns(IngestWarning):
        ingest_run(run)
    for b in run.glob("rank-*/*/heartbeat.bin"):
        b.write_bytes(b.read_bytes()[:8] + struct.pack("<qd", 10**12, killed_at))
    for _ in range(2):
        assert ingest_run(run).skipped
