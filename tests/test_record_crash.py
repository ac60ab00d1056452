"""The recorder under a killed job, preemption, a full disk and a vanished directory."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings

import polars as pl
import pyarrow.parquet as pq
import pytest
from ingest_fixtures import warns_each

from kforge_record import Recorder
from kforge_record.heartbeat import read_heartbeat

CHILD = os.path.join(os.path.dirname(__file__), "record_child.py")


def _start(run, mode, **opts):
    args = [sys.executable, CHILD, str(run), mode] + [f"{k}={v}" for k, v in opts.items()]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_step(proc, n):
    last = 0
    for line in proc.stdout:
        if line.startswith("step "):
            last = int(line.split()[1])
            if last >= n:
                return last
    raise AssertionError(f"child ended before step {n}: {proc.stderr.read()}")


def _drain_last_step(proc, last):
    for line in proc.stdout:
        if line.startswith("step "):
            last = int(line.split()[1])
    return last


def _steps_on_disk(run):
    parts = sorted(run.glob("rank-*/*/part-*.parquet"))
    if not parts:
        return []
    return pl.concat([pl.read_parquet(p) for p in parts], how="diagonal_relaxed")["step"].sort().to_list()


@pytest.mark.parametrize("kill_after", [57, 133])
def test_sigkill_loses_at_most_the_window_and_the_writers_lag(tmp_path, kill_after):
    run = tmp_path / "run"
    window = 20
    proc = _start(run, "plain", flush_every_steps=window, sleep=0.003)
    _wait_for_step(proc, kill_after)
    proc.kill()  # SIGKILL: no handler, no atexit, nothing runs
    last = _drain_last_step(proc, kill_after)
    proc.wait()
    # Every part file visible under its final name is whole and readable.
    for p in run.glob("rank-*/*/part-*.parquet"):
        pq.read_table(p)
    steps = _steps_on_disk(run)
    assert steps == list(range(1, len(steps) + 1)), "flushed steps are contiguous, none duplicated"
    # What is lost is the window being filled plus what the writer had not written yet, which
    # end_step bounds (README "Crash safety"): max(2 windows, 256 rows); a step or two more may
    # end while the kill is on its way. (A quiet machine loses about one window.)
    lag = max(2 * window, 256)
    assert last - len(steps) <= window + lag + 2


def test_sigterm_flushes_then_dies_of_sigterm(tmp_path):
    run = tmp_path / "run"
    proc = _start(run, "plain", flush_every_steps=1_000_000, sleep=0.002)
    _wait_for_step(proc, 40)
    proc.send_signal(signal.SIGTERM)
    last = _drain_last_step(proc, 40)
    assert proc.wait(timeout=30) == -signal.SIGTERM  # the default action still happens, after our flush
    assert _steps_on_disk(run) == list(range(1, last + 1))  # nothing was flushed before SIGTERM
    (end,) = run.glob("rank-*/*/end.json")
    assert json.loads(end.read_text())["reason"] == "sigterm"


def test_sigterm_flushes_a_recorder_built_off_the_main_thread(tmp_path):
    """Built on a setup thread (no handler can be installed there), used from the main thread's
    loop: its first call from the main thread installs the handler, so SIGTERM loses nothing."""
    run = tmp_path / "run"
    proc = _start(run, "off-main", flush_every_steps=1_000_000, sleep=0.002)
    _wait_for_step(proc, 30)
    proc.send_signal(signal.SIGTERM)
    last = _drain_last_step(proc, 30)
    assert proc.wait(timeout=30) == -signal.SIGTERM
    assert _steps_on_disk(run) == list(range(1, last + 1))
    (end,) = run.glob("rank-*/*/end.json")
    assert json.loads(end.read_text())["reason"] == "sigterm"


def test_sigterm_chains_the_previous_handler(tmp_path):
    run = tmp_path / "run"
    proc = _start(run, "prev-handler", flush_every_steps=1_000_000, sleep=0.002)
    _wait_for_step(proc, 25)
    proc.send_signal(signal.SIGTERM)
    out = proc.stdout.read()
    assert proc.wait(timeout=30) == 0
    assert "previous handler ran" in out
    steps = _steps_on_disk(run)
    assert len(steps) >= 25 and steps == list(range(1, len(steps) + 1))


def test_sigterm_with_a_handler_that_lets_training_finish_keeps_every_step(tmp_path):
    run = tmp_path / "run"
    proc = _start(run, "flag-handler", flush_every_steps=1_000_000, sleep=0.002)
    _wait_for_step(proc, 25)
    proc.send_signal(signal.SIGTERM)
    last = _drain_last_step(proc, 25)
    assert proc.wait(timeout=30) == 0
    assert last >= 35  # the loop went on after the signal
    assert _steps_on_disk(run) == list(range(1, last + 1))  # flushed at the signal, and every step after it
    (end,) = run.glob("rank-*/*/end.json")
    assert json.loads(end.read_text())["reason"] == "close"


def test_recorder_dropped_without_close_is_flushed_at_exit(tmp_path):
    run = tmp_path / "run"
    code = f"""
from kforge_record import Recorder
def train():
    rec = Recorder({str(run)!r}, rank=0, world_size=1, flush_every_steps=1000)
    for s in range(1, 51):
        rec.end_step(s, loss=1.0)
train()  # the recorder is no longer referenced by the program
import gc; gc.collect()
"""
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    assert _steps_on_disk(run) == list(range(1, 51))
    (end,) = run.glob("rank-*/*/end.json")
    assert json.loads(end.read_text())["reason"] == "exit"


def test_disk_full_keeps_the_loop_running_and_counts_dropped_rows(tmp_path):
    run = tmp_path / "run"
    # Writes fail for steps 1..100 (flushes at 10, 20, ..., 100). At most 50 rows ever wait for the
    # disk, so steps 1..50 are dropped while it is full; from step 101 it "has space" again, and the
    # window of steps 101..110 arriving on top of the 50 waiting pushes out 51..60 too. (The child
    # flushes after step 110, so the writer handles that window alone even on a loaded machine: taken
    # together with later windows, their rows would push out more of the waiting ones, up to all 50.)
    proc = _start(run, "disk-full", steps=150, flush_every_steps=10, max_backlog_rows=50, heal_at=101, sleep=0)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "done" in out and "step 150" in out  # the training loop never saw an exception
    assert _steps_on_disk(run) == list(range(61, 151))
    assert "dropped 60" in out
    assert err.count("could not write part file") == 1  # warned once, not once per flush
    (end,) = run.glob("rank-*/*/end.json")
    assert json.loads(end.read_text())["dropped_rows_total"] == 60
    # Every part file also carries the running count, for a job that never reaches close().
    last_part = sorted(run.glob("rank-*/*/part-*.parquet"))[-1]
    kv = json.loads(pq.read_schema(last_part).metadata[b"kforge"])
    assert kv["dropped_rows_total"] == 60


def test_vanished_directory_is_recreated_and_backlog_written(tmp_path):
    run = tmp_path / "run"
    rec = Recorder(run, rank=0, world_size=1, flush_every_steps=5, flush_every_s=3600)
    for step in range(1, 6):
        rec.end_step(step, loss=0.1)
    rec.flush()
    shutil.rmtree(run)
    run.write_text("not a directory any more")  # now every write fails (ENOTDIR)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(6, 16):
            rec.end_step(step, loss=0.1)  # must not raise
        rec.flush()
    assert any("could not write" in str(w.message) for w in caught)
    run.unlink()  # the directory can be made again: the backlog is retried at the next flush
    for step in range(16, 21):
        rec.end_step(step, loss=0.1)
    rec.close()
    assert _steps_on_disk(run) == list(range(6, 21))  # steps 1..5 went with the deleted folder
    assert list(run.glob("rank-*/*/meta.json")), "meta.json is rewritten into the recreated folder"
    assert rec.dropped_rows == 0


def test_forked_child_writes_nothing(tmp_path):
    run = tmp_path / "run"
    code = f"""
import os, sys
from kforge_record import Recorder
rec = Recorder({str(run)!r}, rank=0, world_size=1, flush_every_steps=1000)
for s in range(1, 6):
    rec.end_step(s, loss=1.0)
pid = os.fork()
if pid == 0:
    rec.end_step(99, loss=2.0)
    sys.exit(0)  # runs atexit in the child: it must not write the parent's buffer again
os.waitpid(pid, 0)
rec.close()
"""
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    assert _steps_on_disk(run) == [1, 2, 3, 4, 5]
    assert len(list(run.glob("rank-*/*"))) == 1
    (beat,) = run.glob("rank-*/*/heartbeat.bin")
    assert read_heartbeat(str(beat)).step == 5  # nor the parent's heartbeat (a shared mapping)


def test_a_hung_write_bounds_waiting_rows_and_the_loop_goes_on(tmp_path):
    run = tmp_path / "run"
    said = ("has been on one write", "could not write part file", "150 rows were dropped in all")
    with warns_each(*said, category=RuntimeWarning):
        rec = Recorder(run, rank=0, world_size=1, flush_every_steps=10, flush_every_s=3600, max_backlog_rows=50)
        (attempt,) = run.glob("rank-*/*")
        fifo = attempt / ".part-000000.parquet.tmp"
        os.mkfifo(fifo)  # opening it for writing blocks until a reader comes: the first part write hangs
        for step in range(1, 11):
            rec.end_step(step, loss=1.0)
        time.sleep(1.0)  # the writer has taken steps 1..10 and is stuck in open()
        for step in range(11, 201):
            rec.end_step(step, loss=1.0)  # never blocks, never raises
        # 19 windows arrived while the writer hung; only 50 rows may wait: the 14 oldest windows are dropped.
        assert rec.dropped_rows == 140
        fd = os.open(fifo, os.O_RDONLY)  # now unblock the writer, and make its retries go to a real file
        fifo.unlink(missing_ok=True)  # the writer may have got there first: its failed write removes it
        while os.read(fd, 1 << 16):
            pass
        os.close(fd)
        rec.close()
    # The hung write of steps 1..10 went into the pipe and failed (fsync of a FIFO), so they waited
    # again, on top of the 50 newest: the bound pushed them out too. Nothing beyond 50 ever waited.
    assert _steps_on_disk(run) == list(range(151, 201))
    assert json.loads((attempt / "end.json").read_text())["dropped_rows_total"] == 150
