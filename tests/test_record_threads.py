"""Several threads calling one Recorder: end_step appends without a lock and every hand-over takes
it, so none loses or duplicates a row; a call nested in another (a signal handler) and a forked
child do not deadlock."""

import os
import subprocess
import sys
import threading
import time

import pyarrow.parquet as pq
import pytest

from kforge_record import Recorder

# The values that hold a call open are not numbers: they are recorded as null, with the recorder's warning.
pytestmark = pytest.mark.filterwarnings(r"ignore:kforge_record \(rank 0, run .*\). value <test_record_threads\.:RuntimeWarning")


def _table(rec):
    parts = sorted(os.path.join(rec.attempt_dir, n) for n in os.listdir(rec.attempt_dir) if n.startswith("part-"))
    return pq.read_table(parts)


class _Blocking:
    """A value whose capture (``getattr(v, "requires_grad")``, inside end_step) blocks until released:
    it holds a thread inside its call for as long as the test wants."""

    def __init__(self):
        self.inside = threading.Event()
        self.release = threading.Event()

    @property
    def requires_grad(self):
        self.inside.set()
        self.release.wait(10)
        return None  # not a tensor: the value passes through (and becomes null on the writer)


def test_a_second_thread_does_not_wait_for_the_first_threads_end_step_and_both_rows_land(tmp_path):
    rec = Recorder(tmp_path / "run", rank=0, world_size=1, install_sigterm_handler=False)
    blocking = _Blocking()

    def loop():
        for step in (1, 2):
            rec.end_step(step, loss=float(step))
        rec.end_step(3, loss=blocking)  # blocks inside its call
        rec.end_step(4, loss=4.0)

    first = threading.Thread(target=loop)
    first.start()
    assert blocking.inside.wait(10)
    logged = threading.Event()
    other = threading.Thread(target=lambda: (rec.log(2, **{"eval/loss": 0.5}), logged.set()))
    other.start()
    assert logged.wait(10), "the second thread waited for the first one's end_step (it takes no lock)"
    blocking.release.set()
    first.join(10)
    other.join(10)
    assert logged.is_set()
    rec.close()
    table = _table(rec)
    assert sorted(table.column("step").to_pylist()) == [1, 2, 2, 3, 4]
    assert rec.dropped_rows == 0


@pytest.mark.parametrize("second", ["log", "end_step", "flush"])
def test_a_second_thread_that_appears_mid_run_loses_and_duplicates_no_row(tmp_path, second, switch_threads_often):
    per_thread = 4000
    for attempt in range(3):
        rec = Recorder(tmp_path / f"run{attempt}", rank=0, world_size=1, flush_every_steps=7,
                       install_sigterm_handler=False)
        started = threading.Event()

        def loop():
            for i in range(per_thread):
                with rec.phase("data"):
                    pass
                rec.end_step(i, loss=float(i), **{"x": 1.0})
                if i == per_thread // 4:
                    started.set()  # the second thread comes mid-run

        def other():
            started.wait(10)
            for i in range(per_thread // 4):
                if second == "log":
                    rec.log(i, **{"eval/loss": float(i)})
                elif second == "end_step":
                    rec.end_step(per_thread + i, loss=-1.0)
                else:
                    rec.flush()

        threads = [threading.Thread(target=loop), threading.Thread(target=other)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        rec.close()
        table = _table(rec)
        steps = table.column("step").to_pylist()
        ended = sorted(s for s, st in zip(steps, table.column("step_time_s").to_pylist()) if st is not None)
        extra = per_thread // 4 if second == "end_step" else 0
        assert ended == list(range(per_thread + extra)), f"attempt {attempt}"
        assert table.num_rows == per_thread + (per_thread // 4 if second != "flush" else 0)
        assert rec.dropped_rows == 0


def test_a_call_nested_in_a_call_neither_deadlocks_nor_loses_a_row(tmp_path):
    """A signal handler or warning hook runs inside a call: its own calls (log, flush) take the
    re-entrant lock again on the same thread."""
    rec = Recorder(tmp_path / "run", rank=0, world_size=1, install_sigterm_handler=False)
    done = []

    class Nested:
        @property
        def requires_grad(self):
            rec.log(1, **{"eval/loss": 0.25})
            rec.flush()
            done.append(True)
            return None

    rec.end_step(1, loss=1.0)
    rec.end_step(2, loss=Nested())
    rec.end_step(3, loss=3.0)
    assert done == [True]
    rec.close()
    assert sorted(_table(rec).column("step").to_pylist()) == [1, 1, 2, 3]


def test_a_child_forked_while_a_thread_is_inside_a_call_does_not_wait_for_it(tmp_path):
    code = f"""
import os, sys, threading, time
sys.path.insert(0, {os.getcwd()!r})
from kforge_record import Recorder
rec = Recorder({str(tmp_path / "run")!r}, rank=0, world_size=1, install_sigterm_handler=False)
inside, release = threading.Event(), threading.Event()
class Blocking:
    @property
    def requires_grad(self):
        inside.set(); release.wait(20); return None
def caller():
    rec.end_step(1, loss=1.0)
    rec.end_step(2, loss=Blocking())
t = threading.Thread(target=caller); t.start()
inside.wait(10)
pid = os.fork()
if pid == 0:  # the child: the lock was held at the fork by a thread that is not here
    t0 = time.monotonic()
    rec.log(5, loss=1.0); rec.end_step(6, loss=1.0); rec.close()
    os._exit(0 if time.monotonic() - t0 < 5 else 3)
_, status = os.waitpid(pid, 0)
release.set(); t.join(); rec.close()
print("child", os.waitstatus_to_exitcode(status))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "child 0" in out.stdout, out.stdout + out.stderr


def test_phase_times_from_another_thread_land_in_exactly_one_step(tmp_path, monkeypatch, switch_threads_often):
    """Phase timers take no lock: each exit appends (column, seconds) and end_step takes a copy,
    then deletes exactly that many. Every timed second must show up once, whatever the interleaving."""
    from kforge_record import recorder

    clock = threading.local()

    def perf_counter():  # per thread: enter at 2k, exit at 2k + 1, so every timing is exactly 1.0 s
        clock.t = getattr(clock, "t", -1) + 1
        return float(clock.t)

    monkeypatch.setattr(recorder, "perf_counter", perf_counter)  # the recorder's clock, which its timers use
    n_timed = 5000
    for attempt in range(2):
        rec = Recorder(tmp_path / f"run{attempt}", rank=0, world_size=1, flush_every_steps=50,
                       install_sigterm_handler=False)
        timer = rec.phase("data")

        def timing():  # e.g. a prefetch thread timing its own waits
            for _ in range(n_timed):
                with timer:
                    pass
                time.sleep(0)  # hand the GIL back: the loop is then preempted anywhere in end_step

        t = threading.Thread(target=timing)
        t.start()
        step = 0
        while t.is_alive():
            step += 1
            rec.end_step(step, loss=1.0)
        t.join()
        rec.end_step(step + 1, loss=1.0)  # takes what the last exits left
        rec.close()
        col = _table(rec).column("time/data_s").to_pylist()
        assert sum(v for v in col if v is not None) == n_timed, f"attempt {attempt}"
        assert len([v for v in col if v is not None]) > 10  # the two threads did interleave
        assert rec.dropped_rows == 0


def test_an_end_step_while_another_takes_the_phase_times_leaves_them_to_the_next_step(tmp_path):
    """Phase times are taken under a token, not the lock: an end_step that finds the token held (by
    another thread's end_step, or the one a signal handler interrupted) takes none, and they land,
    once, in the next step."""
    rec = Recorder(tmp_path / "run", rank=0, world_size=1, install_sigterm_handler=False)
    with rec.phase("data"):
        pass
    held = rec._taker.pop()  # as another thread's end_step holds it, between its copy and its delete
    rec.end_step(1, loss=1.0)
    rec._taker.append(held)
    rec.end_step(2, loss=2.0)
    rec.end_step(3, loss=3.0)
    rec.close()
    table = _table(rec)
    data = dict(zip(table.column("step").to_pylist(), table.column("time/data_s").to_pylist()))
    assert data[1] is None and data[2] is not None and data[2] >= 0 and data[3] is None


class _LateList(list):
    """The recorder's buffer as a thread sees it that read it just before a hand-over and appends only after
    ``takes`` more hand-overs were written (descheduled between the two lines: free-threaded builds)."""

    def __init__(self, rec, takes):
        super().__init__()
        self.rec, self.takes = rec, takes

    def append(self, row):
        if self.takes:
            takes, self.takes = self.takes, 0
            self.rec.flush()  # this list handed over and taken
            for s in range(100, 100 + takes):  # the loop goes on: more lists taken than the inbox looks back on
                self.rec.end_step(s)
                self.rec.flush()
        super().append(row)


def test_a_row_appended_after_many_more_hand_overs_is_still_written(tmp_path):
    rec = Recorder(str(tmp_path / "late"), rank=0, world_size=1, install_sigterm_handler=False, flush_every_steps=10**6)
    rec.end_step(1)
    rec.flush()
    rec._rows = _LateList(rec, takes=40)
    rec.end_step(2)
    rec.close()
    steps = sorted(_table(rec).column("step").to_pylist())
    assert steps == [1, 2, *range(100, 140)]
    assert rec.dropped_rows == 0
