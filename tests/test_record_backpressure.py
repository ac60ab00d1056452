"""A loop faster than the writer thread loses no row, and a SIGKILL then loses a bounded few.
The bound: the window being filled plus 2 windows the writer has not finished."""

import json
import os
import struct
import subprocess
import sys
import time
import warnings

import pyarrow.parquet as pq
import pytest

from kforge_record import Recorder

CHILD = os.path.join(os.path.dirname(__file__), "record_child.py")


def _steps(run):
    parts = sorted(run.glob("rank-*/*/part-*.parquet"))
    return sorted(pq.read_table(parts, columns=["step"]).column("step").to_pylist()) if parts else []


def _end(rec):
    with open(os.path.join(rec.attempt_dir, "end.json")) as f:
        return json.load(f)


def _spin(seconds):
    t = time.perf_counter() + seconds
    while time.perf_counter() < t:  # busy, like a loop waiting on its GPU: the GIL stays taken
        pass


@pytest.mark.parametrize("shape", ["back to back", "300 scalars at 0.2 ms a step"])
def test_a_loop_faster_than_the_writer_loses_no_row(tmp_path, shape):
    run = tmp_path / "run"
    # max_backlog_rows is small so that a writer falling behind would have to drop within seconds.
    rec = Recorder(run, rank=0, world_size=1, flush_every_steps=100, max_backlog_rows=300, install_sigterm_handler=False)
    names = [f"layer{i}/grad_norm" for i in range(300)]
    n = 40_000 if shape == "back to back" else 3_000
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(1, n + 1):
            if shape == "back to back":
                rec.end_step(step, loss=1.0, lr=1e-3, tokens=4096)
            else:
                rec.end_step(step, loss=1.0, **dict.fromkeys(names, 0.5))
                _spin(0.0002)
        rec.close()
    assert _steps(run) == list(range(1, n + 1))
    assert rec.dropped_rows == 0 and _end(rec)["dropped_rows_total"] == 0
    messages = [str(w.message) for w in caught]
    assert not [m for m in messages if "disk" in m or "dropping" in m or "were dropped" in m]


class _SlowToConvert:
    """A value the writer thread needs 3 ms to read: a writer that is slow, not failing."""

    def __float__(self):
        time.sleep(0.003)
        return 1.0


def test_a_slow_writer_makes_end_step_wait_and_the_warning_says_so(tmp_path):
    run = tmp_path / "run"
    rec = Recorder(run, rank=0, world_size=1, flush_every_steps=10, max_backlog_rows=50, install_sigterm_handler=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(1, 601):
            rec.end_step(step, loss=1.0, slow=_SlowToConvert())
        rec.close()
    assert _steps(run) == list(range(1, 601)) and rec.dropped_rows == 0
    messages = [str(w.message) for w in caught]
    (behind,) = [m for m in messages if "writer thread is behind" in m]
    assert "nothing is dropped" in behind
    assert not [m for m in messages if "disk" in m]
    end = _end(rec)
    assert end["writer_wait_s"] >= 1.0 and end["dropped_rows_by_reason"] == {"disk": 0, "unconvertible": 0,
                                                                             "rejected": 0, "stuck": 0}


def test_sigkill_of_a_loop_faster_than_the_writer_loses_a_bounded_few(tmp_path):
    run, progress = tmp_path / "run", tmp_path / "progress"
    window = 20
    # The writer needs 0.5 ms a row (a slow value), the loop ~500x less: it would run far ahead.
    proc = subprocess.Popen([sys.executable, CHILD, str(run), "plain", f"flush_every_steps={window}", "sleep=0",
                             "slow=0.5", f"progress={progress}"], stderr=subprocess.PIPE, text=True)

    def last_step():
        data = progress.read_bytes() if progress.exists() else b""
        return struct.unpack("<q", data)[0] if len(data) == 8 else 0

    deadline = time.monotonic() + 60
    while last_step() < 2000 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.kill()
    proc.wait()
    last = last_step()
    assert last >= 2000, proc.stderr.read()
    steps = _steps(run)
    assert steps == list(range(1, len(steps) + 1)), "flushed steps are contiguous, none duplicated"
    # Lost: the window being filled (< 20) and the rows handed to the writer and not yet written,
    # at most max(2 windows, 256 rows): end_step waits past that (README "Recording").
    assert last - len(steps) < window + 256
