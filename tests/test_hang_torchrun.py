"""Hangs of real 4-rank gloo jobs under torchrun (tests/hang_child.py), with and without the flight
recorder: the ranks named, their step, phase and line, the collective; and a clean job whose long
checkpoints are no hang. Slow (each job starts four torch processes): the FR-on and FR-off jobs of
a scenario run side by side, and every worker is killed by the pid it recorded.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kforge_dash.ingest.run import ingest_run

HERE = Path(__file__).parent
REPO = HERE.parent
CHILD = HERE / "hang_child.py"


def child_line(marker: str) -> int:
    """The line of hang_child.py that holds ``marker`` (where a stack must point)."""
    return next(i for i, line in enumerate(CHILD.read_text().splitlines(), 1) if marker in line)


def wait_for(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def torchrun(run: Path, modes: str, ranks: str, step: int, *, fr: bool) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    env.pop("TORCH_FR_BUFFER_SIZE", None)
    env.pop("TORCH_NCCL_TRACE_BUFFER_SIZE", None)
    if fr:
        env["TORCH_FR_BUFFER_SIZE"] = "2000"
    # --standalone: a free port of its own (two jobs side by side, other test runs on the machine)
    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4",
                             str(CHILD), str(run), modes, ranks, str(step)],
                            env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def kill_job(proc: subprocess.Popen, run: Path) -> None:
    """torchrun's group, then its workers by the pids they recorded (they may sit in a session of their own)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass  # gone already
    proc.wait()
    for meta in run.glob("rank-*/*/meta.json"):
        try:
            os.kill(json.loads(meta.read_text())["pid"], signal.SIGKILL)
        except (OSError, ValueError, KeyError):
            pass


def fired_stacks(run: Path, rank: int) -> list[Path]:
    return [p for p in run.glob(f"rank-{rank:05d}/*/hang-stacks.txt") if "Timeout (" in p.read_text()]


@pytest.mark.slow
def test_torchrun_gloo_a_rank_stuck_in_compute_is_named_with_step_phase_line_and_collective(tmp_path):
    runs = {fr: tmp_path / ("fr-on" if fr else "fr-off") for fr in (True, False)}
    procs = {}
    try:
        for fr, run in runs.items():
            procs[fr] = torchrun(run, "compute", "2", 30, fr=fr)
        for fr, run in runs.items():
            wait_for(lambda run=run: len(list(run.glob("rank-*/*/hang-1.json"))) == 4, 120, "every rank's evidence")
            if fr:
                wait_for(lambda run=run: len(list(run.glob("rank-*/*/fr-hang-1-rank-*.pkl"))) == 4, 10, "FR dumps")
            wait_for(lambda run=run: len(list(run.glob("rank-*/*/part-*.parquet"))) == 4, 10, "every rank's rows")
    finally:
        for fr, proc in procs.items():
            kill_job(proc, runs[fr])  # the job is hung: killed as a user would
    backward, stall = (f"{CHILD}:{child_line(m)}" for m in ("loss.backward()", "# the stuck rank's line"))
    for fr, run in runs.items():
        summary = ingest_run(str(run)).summary
        (f,) = [f for f in summary["findings"] if f["kind"] == "hang"]
        assert (f["ranks"], f["phase"], f["first_step"], f["severity"]) == ([2], "fwd_bwd", 30, "error"), (fr, f)
        assert f["stacks"] == [{"ranks": [0, 1, 3], "frame": f"{backward} in <module>"},
                               {"ranks": [2], "frame": f"{stall} in stall"}]
        if fr:
            assert f["by"] == "fr" and f["collective"]["op"] == "all_reduce" and f["collective"]["waiting"] == [0, 1, 3]
        else:  # every rank in fwd_bwd at step 30: rank 2 told apart by its line
            assert f["by"] == "frame" and f["collective"] is None
        assert f["hosts"] and f["waited_s"] >= 3.0 and f["gil_held"] == []
        assert not [x for x in summary["findings"] if x["kind"] == "missing_ranks"]  # rank 2's 29 steps were flushed


@pytest.mark.slow
def test_torchrun_gloo_a_rank_stuck_in_data_and_one_holding_the_gil_are_named_with_and_without_fr(tmp_path):
    runs = {fr: tmp_path / ("fr-on" if fr else "fr-off") for fr in (True, False)}
    procs = {}
    try:
        for fr, run in runs.items():
            procs[fr] = torchrun(run, "data,gil", "1,2", 30, fr=fr)
        for fr, run in runs.items():
            wait_for(lambda run=run: len(list(run.glob("rank-*/*/hang-1.json"))) == 3, 120, "ranks 0, 1, 3's evidence")
            wait_for(lambda run=run: fired_stacks(run, 2), 30, "rank 2's stacks, written without the GIL")
            if fr:
                wait_for(lambda run=run: len(list(run.glob("rank-*/*/fr-hang-1-rank-*.pkl"))) == 3, 10, "FR dumps")
            wait_for(lambda run=run: len(list(run.glob("rank-*/*/part-*.parquet"))) == 3, 10, "their rows")
    finally:
        for fr, proc in procs.items():
            kill_job(proc, runs[fr])
    backward, stall, gil = (f"{CHILD}:{child_line(m)}" for m in ("loss.backward()", "# the stuck rank's line",
                                                                  "# a C call that never"))
    for fr, run in runs.items():
        (f,) = [f for f in ingest_run(str(run)).summary["findings"] if f["kind"] == "hang"]
        assert (f["ranks"], f["first_step"], f["phase"], f["gil_held"]) == ([1, 2], 30, None, [2]), (fr, f)
        assert [(s["ranks"], s["last_step"], s["phase"], s["role"]) for s in f["states"]] == [
            ([0, 3], 29, "fwd_bwd", "majority"), ([1], 29, "data", "outlier"), ([2], 29, None, "outlier")]
        assert f["stacks"] == [{"ranks": [0, 3], "frame": f"{backward} in <module>"},
                               {"ranks": [1], "frame": f"{stall} in stall"}, {"ranks": [2], "frame": f"{gil} in hold_gil"}]
        assert f"rank 1 in phase data at {stall} in stall; rank 2 holding the GIL at {gil} in hold_gil" in f["message"]
        if fr:
            assert f["by"] == "fr" and f["collective"]["op"] == "all_reduce" and f["collective"]["waiting"] == [0, 3]
            assert "(rank 2 left no dump: named by its own evidence)" in f["message"]
        else:
            assert f["by"] == "phase" and f["collective"] is None and f["fr_reason"] is None


@pytest.mark.slow
def test_torchrun_gloo_a_clean_job_with_checkpoints_longer_than_hang_after_s_is_no_hang_with_and_without_fr(tmp_path):
    runs = {fr: tmp_path / ("fr-on" if fr else "fr-off") / "run" for fr in (True, False)}
    procs = {}
    try:
        for fr, run in runs.items():
            run.parent.mkdir()
            procs[fr] = torchrun(run, "checkpoint", "-", 25, fr=fr)
        errs = {fr: proc.communicate(timeout=180)[1].decode(errors="replace") for fr, proc in procs.items()}
    finally:
        for fr, proc in procs.items():
            kill_job(proc, runs[fr])
    for fr, run in runs.items():
        assert procs[fr].returncode == 0, errs[fr][-3000:]
        assert len(list(run.parent.glob("ckpt-*.pt"))) == 2  # two checkpoints, each 5.5 s > hang_after_s=3 (+ 2 s grace)
        assert not [p for p in run.rglob("*") if p.name.startswith(("hang", "fr-hang"))]
        summary = ingest_run(str(run)).summary
        assert not [f for f in summary["findings"] if f["kind"] in ("hang", "desync")]
        assert (summary["steps"], summary["last_step"]) == (25, 25)
        assert sorted(json.loads(p.read_text())["reason"] for p in run.glob("rank-*/*/end.json")) == ["close"] * 4
