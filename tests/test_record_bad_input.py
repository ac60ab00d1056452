"""One bad value, step or name costs only itself, and the recorder never raises into the loop: not
with warnings as errors, off the main thread, in a forked child or from several threads at once."""

import json
import os
import subprocess
import sys
import warnings

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from kforge_dash import ingest_run
from kforge_dash.ingest.options import IngestWarning
from kforge_record import Recorder


def _table(rec):
    parts = sorted(os.path.join(rec.attempt_dir, n) for n in os.listdir(rec.attempt_dir) if n.startswith("part-"))
    return pq.read_table(parts).sort_by([("step", "ascending")])


def _end(rec):
    with open(os.path.join(rec.attempt_dir, "end.json")) as f:
        return json.load(f)


class _FloatRaises:
    def __float__(self):
        raise RuntimeError("no value here")


def test_one_unconvertible_value_nulls_only_itself_and_meta_tensors_skip_cuda_sync(tmp_path, monkeypatch):
    synced = []

    def cuda_synchronize(device=None):  # what a CPU-only torch does, recorded
        synced.append(device)
        raise RuntimeError("Torch not compiled with CUDA enabled")

    monkeypatch.setattr(torch.cuda, "synchronize", cuda_synchronize)
    rec = Recorder(tmp_path / "run", rank=0, world_size=1, flush_every_steps=100, install_sigterm_handler=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(1, 101):
            loss = torch.empty((), device="meta") if step == 50 else torch.tensor(float(step))
            aux = _FloatRaises() if step == 60 else 0.5
            rec.end_step(step, loss=loss, aux=aux)
        rec.close()
    table = _table(rec)
    assert table.column("step").to_pylist() == list(range(1, 101)), "the window is kept"
    loss = table.column("loss").to_pylist()
    assert loss[49] is None and loss[:49] == [float(s) for s in range(1, 50)] and loss[50] == 51.0
    aux = table.column("aux").to_pylist()
    assert aux[59] is None and aux.count(None) == 1
    messages = [str(w.message) for w in caught]
    assert len([m for m in messages if "meta device" in m]) == 1
    assert len([m for m in messages if "'aux'" in m and "not a number" in m]) == 1
    assert synced == [], "a meta tensor never goes through torch.cuda.synchronize"
    assert rec.dropped_rows == 0


def test_a_tensor_made_in_inference_mode_is_recorded(tmp_path):
    with torch.inference_mode():
        loss = torch.tensor(2.5) * 1  # no version counter: end_step must not trip over it
    with Recorder(tmp_path / "run", rank=0, world_size=1, install_sigterm_handler=False) as rec:
        rec.end_step(1, loss=loss)
    assert _table(rec).column("loss").to_pylist() == [2.5]


BAD_STEPS = [None, "5", 2**70, -(2**70), True, 3.0, torch.tensor(4)]


def test_bad_steps_are_refused_at_the_call_counted_and_never_written(tmp_path):
    run = tmp_path / "run"
    rec = Recorder(run, rank=0, world_size=1, install_sigterm_handler=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rec.end_step(1, loss=1.0)
        for bad in BAD_STEPS:
            rec.end_step(bad, loss=9.0)
            rec.log(bad, **{"eval/loss": 9.0})
        rec.end_step(np.int64(2), loss=2.0)  # numpy integers are steps
        rec.log(2, **{"eval/loss": 0.5})
        rec.close()
    table = _table(rec)
    assert table.column("step").type == "int64" and table.column("step").to_pylist() == [1, 2, 2]
    assert 9.0 not in table.column("loss").to_pylist()
    assert rec.dropped_rows == 2 * len(BAD_STEPS)
    end = _end(rec)
    assert end["dropped_rows_total"] == 2 * len(BAD_STEPS) and end["dropped_rows_by_reason"]["rejected"] == 2 * len(BAD_STEPS)
    messages = [str(w.message) for w in caught]
    assert len([m for m in messages if "end_step: step" in m and "not an integer" in m]) == 1  # once per call site
    assert len([m for m in messages if "log: step" in m]) == 1
    # the rows were refused, not lost to the disk: the warning must not say only "disk errors"
    with pytest.warns(IngestWarning, match=f"the recorder dropped {2 * len(BAD_STEPS)} row.*refused steps"):
        summary = ingest_run(run).summary  # the run ingests: no null step anywhere
    assert summary["steps"] == 2 and summary["dropped_rows"] == 2 * len(BAD_STEPS)


def test_warnings_never_raise_inside_the_recorder_even_as_errors(tmp_path, capfd):
    rec = Recorder(tmp_path / "run", rank=0, world_size=1, close_timeout_s=10, install_sigterm_handler=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # as many test suites run
        rec.end_step(1, loss="a string")  # warned on the writer thread
        rec.end_step(None, loss=1.0)  # warned on the calling thread
        rec.end_step(2, loss=2.0)
        rec.close()
    assert _table(rec).column("loss").to_pylist() == [None, 2.0]
    assert _end(rec)["rows_written"] == 2
    err = capfd.readouterr().err
    assert "is not a number; recorded as null" in err and "step None is not an integer" in err


def test_bad_phase_and_scalar_names_are_refused_at_the_call(tmp_path):
    run = tmp_path / "run"
    rec = Recorder(run, rank=0, world_size=1, install_sigterm_handler=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in (1, 2):
            with rec.phase(["x"]):  # unhashable: used to raise TypeError into the loop
                pass
            with rec.phase(""), rec.phase("a\0b"), rec.phase("data"):
                pass
            rec.end_step(step, loss=1.0, **{"": 1.0, "bad\0name": 2.0, "ok": 3.0})
        rec.log(2, **{"": 4.0, "eval/loss": 0.5})
        rec.close()
    names = _table(rec).column_names
    assert "ok" in names and "time/data_s" in names and "eval/loss" in names
    assert not [n for n in names if n in ("", "time/_s") or "\0" in n or n.startswith("time/[")]
    messages = [str(w.message) for w in caught]
    assert len([m for m in messages if "scalar name ''" in m]) == 1
    assert len([m for m in messages if "'bad\\x00name'" in m]) == 1
    assert len([m for m in messages if "phase name" in m]) == 3
    assert ingest_run(run).summary["steps"] == 2


def _warned(stderr: str, phrase: str) -> int:
    """How many warnings (not the source lines Python prints under them) say ``phrase``."""
    return len([line for line in stderr.splitlines() if "RuntimeWarning: kforge_record" in line and phrase in line])


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_a_recorder_built_and_called_off_the_main_thread_says_sigterm_is_not_handled(tmp_path):
    """Built and called on other threads only: no handler can be installed (the first call from
    the main thread would install it: tests/test_record_crash.py), and that is said once."""
    out = _python(f"""
import threading, warnings
warnings.simplefilter("always")
from kforge_record import Recorder
def build(i):
    rec = Recorder({str(tmp_path)!r} + f"/run{{i}}", rank=0, world_size=1)
    for s in range(1, 4):
        rec.end_step(s, loss=1.0)
    rec.close()
for i in range(2):
    t = threading.Thread(target=build, args=(i,)); t.start(); t.join()
""")
    assert out.returncode == 0, out.stderr
    assert _warned(out.stderr, "called off the main thread: no SIGTERM handler yet") == 1  # once, not per call
    assert "rec.close()" in out.stderr


def test_a_forked_child_keeps_no_rows(tmp_path):
    out = _python(f"""
import os, sys, tracemalloc, warnings
warnings.simplefilter("always")
from kforge_record import Recorder
rec = Recorder({str(tmp_path / "run")!r}, rank=0, world_size=1, flush_every_steps=100)
for s in range(1, 51):
    rec.end_step(s, loss=1.0)
pid = os.fork()
if pid == 0:
    tracemalloc.start()
    for s in range(100_000):  # a DataLoader worker that calls end_step: its rows must not pile up
        rec.end_step(s, loss=float(s))
    grown = tracemalloc.get_traced_memory()[0]
    print("child grew", grown, flush=True)
    os._exit(0 if grown < 2_000_000 else 1)
_, status = os.waitpid(pid, 0)
rec.close()
sys.exit(os.waitstatus_to_exitcode(status))
""")
    assert out.returncode == 0, out.stdout + out.stderr
    assert _warned(out.stderr, "forked child") == 1
    steps = pq.read_table(sorted((tmp_path / "run").glob("rank-*/*/part-*.parquet")), columns=["step"])
    assert steps.column("step").to_pylist() == list(range(1, 51))


@pytest.mark.parametrize("n_threads", [4])
def test_several_threads_calling_end_step_and_log_lose_no_row(tmp_path, n_threads, switch_threads_often):
    import threading

    per_thread = 3000
    for attempt in range(5):
        rec = Recorder(tmp_path / f"run{attempt}", rank=0, world_size=1, flush_every_steps=7,
                       install_sigterm_handler=False)

        def loop(t):
            for i in range(per_thread):
                rec.end_step(t * per_thread + i, loss=float(t))

        def evaluate():
            for i in range(per_thread // 10):
                rec.log(i, **{"eval/loss": float(i)})

        threads = [threading.Thread(target=loop, args=(t,)) for t in range(n_threads)]
        threads.append(threading.Thread(target=evaluate))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        rec.close()
        table = _table(rec)
        ended = [s for s, st in zip(table.column("step").to_pylist(), table.column("step_time_s").to_pylist())
                 if st is not None]
        assert sorted(ended) == list(range(n_threads * per_thread)), f"attempt {attempt}"
        assert table.num_rows == n_threads * per_thread + per_thread // 10
        assert rec.dropped_rows == 0
