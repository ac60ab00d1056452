"""The recorder's hang watch (kforge_record/hang.py) and ingest's hang finding (findings/hang.py).

One real 4-rank gloo job under torchrun (slow); the other cases in-process or with one child process.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from kforge_dash.browse.hang import hang_lines
from kforge_dash.ingest.run import ingest_run
from kforge_record import Recorder

HERE = Path(__file__).parent
REPO = HERE.parent


def hang_findings(run: Path) -> list[dict]:
    summary = ingest_run(str(run)).summary
    return [f for f in summary["findings"] if f["kind"] == "hang"]


def wait_for(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _steps(rec, first, last, phase="fwd_bwd"):
    for s in range(first, last + 1):
        with rec.phase(phase):
            time.sleep(0.005)
        rec.end_step(s, loss=1.0)


def test_a_rank_stuck_in_its_data_phase_leaves_step_phase_stacks_and_rows_once_per_stall(tmp_path):
    rec = Recorder(tmp_path / "run", rank=0, world_size=1, hang_after_s=1.0, hw_every_s=0, flush_every_steps=1000)
    _steps(rec, 1, 5)
    with rec.phase("data"):
        wait_for(lambda: list(Path(rec.attempt_dir).glob("hang-*.json")), 10, "the stall's evidence")
        time.sleep(2.5)  # still stalled: no second file (once per stall)
    doc = json.loads((Path(rec.attempt_dir) / "hang-1.json").read_text())
    assert [p.name for p in Path(rec.attempt_dir).glob("hang-*.json")] == ["hang-1.json"]
    assert (doc["last_step"], doc["phase"], doc["open_phases"], doc["threshold_s"]) == (5, "data", ["data"], 1.0)
    loop = next(t for t in doc["threads"] if t["id"] == doc["loop_thread"])
    assert loop["frames"][-1][0] == __file__  # where the loop waits: in this test's wait_for
    # the five ended steps were flushed at the stall (flush_every_steps=1000 would not have)
    steps = sorted(s for p in Path(rec.attempt_dir).glob("part-*.parquet") for s in pq.read_table(p)["step"].to_pylist())
    assert steps == [1, 2, 3, 4, 5]
    _steps(rec, 6, 8)  # steps again, then a second stall: a second file
    wait_for(lambda: (Path(rec.attempt_dir) / "hang-2.json").exists(), 10, "the second stall")
    assert json.loads((Path(rec.attempt_dir) / "hang-2.json").read_text())["last_step"] == 8
    # a stall that ended (steps went on) is no hang at ingest; neither is a clean close
    _steps(rec, 9, 10)
    rec.close()
    assert not (Path(rec.attempt_dir) / "hang-stacks.txt").exists()  # faulthandler never fired: removed
    assert hang_findings(tmp_path / "run") == []


def test_a_long_checkpoint_under_the_threshold_leaves_nothing(tmp_path):
    rec = Recorder(tmp_path / "run", rank=0, world_size=1, hang_after_s=2.5, hw_every_s=0)
    _steps(rec, 1, 3)
    with rec.phase("checkpoint"):
        time.sleep(1.8)
    _steps(rec, 4, 6)
    time.sleep(1.5)
    rec.close()
    assert not [p.name for p in Path(rec.attempt_dir).iterdir() if p.name.startswith(("hang", "fr-hang"))]


def test_a_phase_within_its_allowance_is_no_stall_and_one_past_it_is(tmp_path):
    rec = Recorder(tmp_path / "run", rank=0, world_size=1, hang_after_s=2.0, hw_every_s=0,
                   hang_allow_s={"checkpoint": 60.0, "eval": 2.0})
    _steps(rec, 1, 3)
    with rec.phase("checkpoint"):
        time.sleep(2.5)  # more than hang_after_s, well within its allowance
    # the threshold counts again from the phase's end: a second after it (a watch tick at least) the step
    # before the checkpoint is 3.5 s old, still no stall
    time.sleep(1.2)
    _steps(rec, 4, 5)
    assert not list(Path(rec.attempt_dir).glob("hang-*.json"))
    with rec.phase("eval"):  # an allowance is no blank cheque: past it, the stall is called
        wait_for(lambda: list(Path(rec.attempt_dir).glob("hang-*.json")), 15, "the stall past its allowance")
    doc = json.loads((Path(rec.attempt_dir) / "hang-1.json").read_text())
    assert (doc["last_step"], doc["phase"], doc["allow_s"]) == (5, "eval", {"checkpoint": 60.0, "eval": 2.0})
    assert doc["stalled_s"] >= 2.0
    rec.close()


def test_the_watch_is_off_at_zero_and_its_threshold_is_validated(tmp_path):
    rec = Recorder(tmp_path / "run", rank=0, world_size=1, hang_after_s=0, hw_every_s=0)
    assert rec._hang is None
    rec.close()
    for bad in (-1, float("nan"), True, "5"):
        with pytest.raises((ValueError, TypeError), match="hang_after_s"):
            Recorder(tmp_path / "bad", rank=0, world_size=1, hang_after_s=bad)
    for bad in ({"checkpoint": 0}, {"": 5}, {"checkpoint": float("inf")}, ["checkpoint"]):
        with pytest.raises((ValueError, TypeError), match="hang_allow_s"):
            Recorder(tmp_path / "bad", rank=0, world_size=1, hang_allow_s=bad)


GIL_CHILD = textwrap.dedent("""
    import ctypes, sys, time
    from kforge_record import Recorder
    rec = Recorder(sys.argv[1], rank=0, world_size=1, hang_after_s=1.0, hw_every_s=0)
    for s in range(1, 200):  # 2 s of steps: the watch has armed faulthandler
        with rec.phase("fwd_bwd"):
            time.sleep(0.01)
        rec.end_step(s, loss=1.0)
    def held():
        ctypes.PyDLL(None).sleep(60)  # a C call that never releases the GIL
    with rec.phase("fwd_bwd"):
        held()
""")


ALLOWED_GIL_CHILD = textwrap.dedent("""
    import ctypes, sys, time
    from kforge_record import Recorder
    rec = Recorder(sys.argv[1], rank=0, world_size=1, hang_after_s=1.0, hw_every_s=0,
                   hang_allow_s={"checkpoint": 30.0})
    for s in range(1, 101):  # 1 s of steps: the watch has armed faulthandler
        time.sleep(0.01)
        rec.end_step(s, loss=1.0)
    with rec.phase("checkpoint"):
        ctypes.PyDLL(None).sleep(4)  # a pickling-like C call holding the GIL past threshold + faulthandler's grace
    for s in range(101, 111):
        time.sleep(0.01)
        rec.end_step(s, loss=1.0)
    rec.close()
""")


def test_an_allowed_phase_holding_the_gil_leaves_no_stacks_and_no_stall(tmp_path):
    """A checkpoint named in hang_allow_s whose body holds the GIL 4 s (threshold 1 s + 2 s grace): entering it
    pushed faulthandler's timer past the allowance, leaving it restarted the threshold: no evidence at all."""
    child = tmp_path / "allowed_gil_child.py"
    child.write_text(ALLOWED_GIL_CHILD)
    proc = subprocess.run([sys.executable, str(child), str(tmp_path / "run")], timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (attempt,) = (tmp_path / "run").glob("rank-*/*/")
    assert not [p.name for p in attempt.iterdir() if p.name.startswith("hang")], proc.stderr[-2000:]


def test_a_rank_holding_the_gil_still_leaves_its_stacks(tmp_path):
    child = tmp_path / "gil_child.py"
    child.write_text(GIL_CHILD)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, str(child), str(tmp_path / "run")], env=env)
    try:
        stacks = wait_for(lambda: [p for p in (tmp_path / "run").glob("rank-*/*/hang-stacks.txt")
                                   if "Timeout (" in p.read_text()], 30, "faulthandler's stacks")
    finally:
        proc.kill()
        proc.wait()
    assert not list(stacks[0].parent.glob("hang-*.json"))  # no Python ran: only the C watchdog wrote
    (f,) = hang_findings(tmp_path / "run")
    assert f["gil_held"] == [0] and f["stacks"] == [{"ranks": [0], "frame": f"{child}:10 in held"}]
    assert f["first_step"] == 200 and f["phase"] is None and "holding the GIL" in f["message"]


def test_a_job_killed_without_stall_evidence_is_no_hang(tmp_path):
    run = tmp_path / "run"
    proc = subprocess.run([sys.executable, str(HERE / "kill_child.py"), str(run), "1796000000", "1", "30", "10", "1"],
                          env={**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{HERE}"}, capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    kinds = [f["kind"] for f in ingest_run(str(run)).summary["findings"]]
    assert "unrecorded_steps" in kinds and "hang" not in kinds


STALL_CHILD = textwrap.dedent("""
    import sys, time
    from kforge_record import Recorder
    rec = Recorder(sys.argv[1], rank=0, world_size=1, hang_after_s=1.5, hw_every_s=0, flush_every_steps=10)
    for s in range(1, 40):
        with rec.phase("fwd_bwd"):
            time.sleep(0.01)
        rec.end_step(s, loss=1.0)
    with rec.phase("data"):
        time.sleep(120)  # the stall
""")


def test_a_watch_started_on_an_empty_root_waits_and_sends_the_hang_while_the_job_is_hung(tmp_path):
    root, calls = tmp_path / "runs", tmp_path / "calls.jsonl"
    root.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = f"{sys.executable} {HERE / 'on_finding_cmd.py'} {calls} ok"
    watcher = subprocess.Popen([sys.executable, "-m", "kforge_dash.cli.ingest", str(root), "--watch", "0.5", "--no-tensorboard",
                                "--no-wandb", "--quiet", "--on-finding", cmd], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    child = tmp_path / "stall_child.py"
    child.write_text(STALL_CHILD)
    job = None
    try:
        time.sleep(1.5)  # a few passes over the empty root: the watcher waits, says nothing is wrong
        assert watcher.poll() is None
        job = subprocess.Popen([sys.executable, str(child), str(root / "job")], env=env)
        wait_for(lambda: calls.exists() and "hang" in calls.read_text(), 60, "the hang sent")
        assert job.poll() is None  # sent while the job is still hung
    finally:
        if job is not None:
            job.kill()
            job.wait()
        watcher.send_signal(signal.SIGINT)
        _, err = watcher.communicate(timeout=60)
    assert "no kforge runs found" not in err and "error" not in err, err
    (sent,) = [json.loads(line)["finding"] for line in calls.read_text().splitlines()
               if json.loads(line)["finding"]["kind"] == "hang"]
    assert (sent["first_step"], sent["phase"], sent["stacks"][0]["frame"]) == (40, "data", f"{child}:10 in <module>")


def test_the_run_page_report_and_tensorboard_show_the_hang_first(tmp_path, monkeypatch):
    from click.testing import CliRunner
    from dash_fixtures import detail_page

    from kforge_dash.cli.report import main as report_main
    from kforge_dash.export.tb_findings import findings_by_step

    rec = Recorder(tmp_path / "runs" / "job", rank=0, world_size=1, hang_after_s=1.0, hw_every_s=0)
    _steps(rec, 1, 5)
    with rec.phase("**load** <b>x</b>"):  # a name from disk: shown as typed, never rendered
        wait_for(lambda: list(Path(rec.attempt_dir).glob("hang-*.json")), 10, "the stall's evidence")
        wait_for(lambda: list(Path(rec.attempt_dir).glob("part-*.parquet")), 10, "its rows, flushed after it")
    (Path(rec.attempt_dir) / "hang-stacks.txt").unlink(missing_ok=True)  # (close would, when empty)
    summary = ingest_run(str(tmp_path / "runs" / "job")).summary
    rec.close()  # after the ingest: a closed recorder's last stall is no hang
    at = detail_page(tmp_path / "runs", monkeypatch, "job")
    assert not at.exception
    first = at.error[0].value
    assert first.startswith(r"Hung\: Launch 0 hung after step 5\: rank 0 stalled, in phase")
    assert r"\*\*load\*\* \<b\>x\</b\>" in first
    assert at.dataframe[0].value["role"].tolist() == ["stalled"]
    assert any(f"{__file__}:" in t.value and " in wait_for" in t.value for t in at.text)
    (tb,) = findings_by_step(summary)[6]
    assert tb[0] == "findings/hang" and "1 at " in tb[1]
    r = CliRunner().invoke(report_main, [str(tmp_path / "runs"), "-o", str(tmp_path / "r.html")])
    assert r.exit_code == 0, r.output
    page = (tmp_path / "r.html").read_text()
    assert '<div class="hang"><h4>Hung: Launch 0 hung after step 5' in page and "&lt;b&gt;x&lt;/b&gt;" in page


def _three_ranks_stalled(tmp_path, *, behind: bool) -> dict:
    """Ranks 0-2 of one launch (three Recorders here): rank 2 stalls in its data phase, the others
    in fwd_bwd; ``behind``: rank 2 ended one step fewer. Returns rank -> Recorder, stalls written."""
    recs = {r: Recorder(tmp_path / "run", rank=r, world_size=3, hang_after_s=1.0, hw_every_s=0) for r in range(3)}
    for s in range(1, 6):
        for r, rec in recs.items():
            if not (behind and r == 2 and s == 5):
                rec.end_step(s, loss=1.0)
    phases = [recs[0].phase("fwd_bwd"), recs[1].phase("fwd_bwd"), recs[2].phase("data")]
    for p in phases:
        p.__enter__()
    wait_for(lambda: len(list((tmp_path / "run").glob("rank-*/*/hang-1.json"))) == 3, 15, "three ranks' evidence")
    # the evidence is written first (a GPU hang can block the writer's copy), the rows just after it
    wait_for(lambda: len({p.parent for p in (tmp_path / "run").glob("rank-*/*/part-*.parquet")}) == 3, 15, "their rows")
    for p in phases:
        p.__exit__(None, None, None)
    return recs


def test_without_flight_recorder_the_rank_behind_is_named_with_its_phase(tmp_path):
    recs = _three_ranks_stalled(tmp_path, behind=True)
    (f,) = hang_findings(tmp_path / "run")
    assert (f["ranks"], f["by"], f["first_step"], f["phase"], f["collective"]) == ([2], "step", 5, "data", None)
    assert [(s["ranks"], s["last_step"], s["phase"], s["role"]) for s in f["states"]] == [
        ([0, 1], 5, "fwd_bwd", "majority"), ([2], 4, "data", "outlier")]
    assert "behind the others: rank 2" in f["message"] and "collective: unknown" in "\n".join(hang_lines(f))
    for rec in recs.values():
        rec._hang.close()  # (their stalls stand: no close() of the recorders, which would end them cleanly)


def test_flight_recorder_dumps_name_the_rank_and_a_desync_is_its_own_finding(tmp_path):
    import pickle

    recs = _three_ranks_stalled(tmp_path, behind=False)
    dumps = {r: pickle.loads((HERE / "data" / "fr_gloo" / "missing_world" / f"rank_{r}").read_bytes()) for r in range(3)}
    e = dumps[1]["entries"][0]
    e["input_dtypes"] = ["Int"]  # rank 1 issued its first collective with another dtype than rank 0 and 2
    for r, rec in recs.items():  # what the watch writes when torch.distributed is up and the FR on
        (Path(rec.attempt_dir) / f"fr-hang-1-rank-{r}.pkl").write_bytes(pickle.dumps(dumps[r]))
    summary = ingest_run(str(tmp_path / "run")).summary
    (f,) = [x for x in summary["findings"] if x["kind"] == "hang"]
    assert (f["ranks"], f["by"], f["phase"], f["collective"]["op"]) == ([2], "fr", "data", "all_reduce")
    (d,) = [x for x in summary["findings"] if x["kind"] == "desync"]
    assert d["ranks"] == [1] and d["severity"] == "error" and d["desync"][0]["seq"] == e["collective_seq_id"]
    for rec in recs.values():
        rec._hang.close()


def test_a_hang_whose_ranks_fill_in_over_two_passes_is_sent_once(tmp_path):
    from kforge_dash.cli.on_finding import new_findings

    partial = {"kind": "hang", "severity": "error", "first_step": 30, "last_step": 30, "ranks": [], "phase": "fwd_bwd"}
    full = {**partial, "ranks": [2], "phase": "data"}  # the next pass: the last rank's evidence arrived
    assert new_findings(str(tmp_path), [partial], print) == [partial]
    assert new_findings(str(tmp_path), [full], print) == []
    later = {**full, "first_step": 90, "last_step": 90}  # a hang of a later launch is news
    assert new_findings(str(tmp_path), [later], print) == [later]


def test_pytorchs_own_watchdog_dumps_at_the_recorded_prefix_are_used(tmp_path, monkeypatch):
    import shutil

    prefix = tmp_path / "fr" / "nccl_trace_rank_"
    prefix.parent.mkdir()
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "2000")
    monkeypatch.setenv("TORCH_FR_DUMP_TEMP_FILE", str(prefix))
    recs = _three_ranks_stalled(tmp_path, behind=False)  # no torch.distributed here: the watch wrote no dump
    meta = json.loads((Path(recs[0].attempt_dir) / "meta.json").read_text())
    assert meta["fr"] == {"buffer_size": 2000, "dump_file": str(prefix)}
    for r in range(3):  # what PyTorch's watchdog writes at its timeout: <prefix><rank>
        shutil.copy(HERE / "data" / "fr_gloo" / "missing_world" / f"rank_{r}", f"{prefix}{r}")
    (f,) = hang_findings(tmp_path / "run")
    assert (f["ranks"], f["by"], f["collective"]["op"]) == ([2], "fr", "all_reduce")
    for rec in recs.values():
        rec._hang.close()


def test_pytorchs_dumps_written_outside_the_run_after_an_ingest_are_read_by_the_next_without_force(tmp_path, monkeypatch):
    import shutil

    prefix = tmp_path / "elsewhere" / "fr" / "trace_rank_"  # TORCH_FR_DUMP_TEMP_FILE outside the run folder
    prefix.parent.mkdir(parents=True)
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "2000")
    monkeypatch.setenv("TORCH_FR_DUMP_TEMP_FILE", str(prefix))
    recs = _three_ranks_stalled(tmp_path, behind=False)
    (before,) = hang_findings(tmp_path / "run")  # the watch's pass: PyTorch's watchdog has not dumped yet
    assert before["collective"] is None
    for r in range(3):  # later, at its timeout, PyTorch's watchdog writes <prefix><rank>
        shutil.copy(HERE / "data" / "fr_gloo" / "missing_world" / f"rank_{r}", f"{prefix}{r}")
    (after,) = hang_findings(tmp_path / "run")  # no --force: the dumps are in the fingerprint
    assert (after["ranks"], after["by"], after["collective"]["op"]) == ([2], "fr", "all_reduce")
    os.remove(f"{prefix}1")
    os.mkfifo(f"{prefix}1")  # a FIFO at the prefix: never opened, never waited on
    (fifo,) = hang_findings(tmp_path / "run")  # (ingested again: the fingerprint saw the change)
    assert fifo["first_step"] == after["first_step"] and fifo["fr_reason"] != after["fr_reason"]
    for rec in recs.values():
        rec._hang.close()
