"""What "live" means on the dashboard: a recorder of the run's newest launch, not closed, ended a step
within LIVE_WINDOW_S, read from what the recorder writes inside its files (end.json, heartbeat.bin),
not from file times, which a clone or a copy sets to now."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from findings_fixtures import T0

from kforge_dash.browse import runs as prep_runs
from kforge_dash.browse.views.common import LIVE_WINDOW_S, active

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = Path(HERE).parent


def _live(path) -> bool:
    """What the compare page's live toggle opens with for this run."""
    return active([prep_runs.RunInfo(Path(path).name, Path(path), prep_runs.INGESTED)])


def test_a_fresh_copy_of_the_sample_runs_is_not_live(tmp_path):
    root = tmp_path / "sample_runs"
    shutil.copytree(REPO / "sample_runs", root, ignore=shutil.ignore_patterns("ingested"))
    now = time.time()
    for dirpath, dirnames, filenames in os.walk(root):  # as git clone leaves them: every file and folder new
        for n in dirnames + filenames:
            os.utime(os.path.join(dirpath, n), (now, now))
    runs = sorted(p for p in root.iterdir() if p.is_dir())
    assert len(runs) >= 7
    assert [r.name for r in runs if _live(r)] == []


def test_an_open_recorder_that_just_ended_a_step_is_live(tmp_path):
    from kforge_record import Recorder

    rec = Recorder(tmp_path / "run", rank=0, world_size=1, install_sigterm_handler=False)
    try:
        rec.start_step()
        rec.end_step(1, loss=1.0)
        assert _live(tmp_path / "run")
    finally:
        rec.close()
    assert not _live(tmp_path / "run")  # closed: end.json says it finished


def test_a_killed_run_with_an_old_heartbeat_is_not_live(tmp_path):
    """A real SIGKILL (tests/kill_child.py, on a fake clock from long ago): no end.json, its files
    written just now, its heartbeat's last step ended at the fake clock's time."""
    run = tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")])}
    p = subprocess.run([sys.executable, os.path.join(HERE, "kill_child.py"), str(run), repr(T0), "1", "20", "10", "1"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == -signal.SIGKILL, p.stderr
    assert list(run.glob("rank-*/*/heartbeat.bin")) and not list(run.glob("rank-*/*/end.json"))
    assert time.time() - max(f.stat().st_mtime for f in run.rglob("*")) < LIVE_WINDOW_S  # fresh files
    assert not _live(run)


def test_an_open_recorder_before_its_first_step_is_live_by_its_start(tmp_path):
    """No step ended yet (the heartbeat's time is 0): meta.json's start_time says when it started."""
    import json

    from kforge_record import Recorder

    rec = Recorder(tmp_path / "run", rank=0, world_size=1, install_sigterm_handler=False)
    try:
        assert _live(tmp_path / "run")
        (meta,) = (tmp_path / "run").glob("rank-*/*/meta.json")
        m = json.loads(meta.read_text())
        m["start_time"] -= 2 * LIVE_WINDOW_S  # started long ago and never ended a step: not live
        meta.write_text(json.dumps(m))
        assert not _live(tmp_path / "run")
    finally:
        rec.close()


def test_the_compare_page_follows_a_live_run_instead_of_flagging_it_out_of_date(tmp_path, monkeypatch):
    """A run being written is appended by the page's live refresh: its ingest panel does not also list it
    as out of date (it did, beside the '● live' badge); a stale run that is not live still is."""
    from dash_fixtures import shown
    from streamlit.testing.v1 import AppTest

    from kforge_dash.ingest.run import ingest_run
    from kforge_record import Recorder

    root = tmp_path / "runs"

    def steps(rec, first, last):
        for step in range(first, last + 1):
            rec.end_step(step, loss=1.0 / step)
        rec.flush()

    for launch in (1, 11):  # done-run: ingested after its first launch, then resumed: stale, and finished
        with Recorder(root / "done-run", rank=0, world_size=1, install_sigterm_handler=False) as rec:
            steps(rec, launch, launch + 9)
        if launch == 1:
            ingest_run(str(root / "done-run"))
    with Recorder(root / "live-run", rank=0, world_size=1, install_sigterm_handler=False) as rec:
        steps(rec, 1, 5)
        ingest_run(str(root / "live-run"))
        steps(rec, 6, 10)  # new parts since the ingest, and the recorder is open: stale and live
        monkeypatch.setenv("KFORGE_DASH_ROOT", str(root))
        at = AppTest.from_file(str(REPO / "kforge_dash" / "browse" / "app.py"), default_timeout=300)
        at.run()
        assert not at.exception
        flagged = [shown(w.value) for w in at.warning if "out of date" in shown(w.value)]
        assert len(flagged) == 1 and "done-run (stale)" in flagged[0] and "live-run" not in flagged[0], flagged


@pytest.mark.parametrize("t", [float("inf"), "a day ahead"])
def test_an_impossible_heartbeat_time_is_no_sign_of_life(tmp_path, t):
    """A heartbeat of the right layout whose end time is inf or a day in the future (issue 32.1): the
    run is not live for ever; as for a recorder without a heartbeat, its folders' times decide."""
    import struct

    run = tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")])}
    p = subprocess.run([sys.executable, os.path.join(HERE, "kill_child.py"), str(run), repr(T0), "1", "20", "10", "1"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == -signal.SIGKILL, p.stderr
    t = time.time() + 86400 if isinstance(t, str) else t
    for b in run.glob("rank-*/*/heartbeat.bin"):
        b.write_bytes(b.read_bytes()[:8] + struct.pack("<qd", 20, t))
    for f in run.rglob("*"):
        os.utime(f, (T0, T0))
    assert not _live(run)
