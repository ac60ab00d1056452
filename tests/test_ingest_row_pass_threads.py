"""The row pass reduces each batch on a worker thread (window.Reducer) while the next batch is
read, within a window and across windows: the outputs stay those of a read-then-reduce ingest,
a reduction's error surfaces, and the overlap is real."""

import os
import threading

import polars as pl
import pytest
from row_pass_fixtures import Whole, make_run, outputs, warns_of_make_run

from kforge_dash.ingest.options import IngestOptions
from kforge_dash.ingest.rowpass import buffers, reduce, window
from kforge_dash.ingest.run import ingest_run


@pytest.mark.parametrize("chunk_rows", [30, 360, 100_000])
def test_windows_reduced_on_a_thread_give_the_outputs_of_read_then_reduce(tmp_path, monkeypatch, chunk_rows):
    # 30: windows in many batches; 360: many windows, each read whole (reduce_steps on the
    # thread, one window's reduction while the next is read); 100_000: one window.
    run = make_run(tmp_path / "run", monkeypatch, resume_eval=True)
    with warns_of_make_run():
        ingest_run(run, options=IngestOptions(chunk_rows=chunk_rows), windows=Whole())  # in this thread, read then reduce
    whole = outputs(run)
    with warns_of_make_run():
        ingest_run(run, options=IngestOptions(chunk_rows=chunk_rows, force=True))
    here = outputs(run)
    assert here[0] == whole[0]
    assert here[1].equals(whole[1])
    assert here[2] == whole[2]


def test_a_batch_is_reduced_while_the_next_one_is_read(tmp_path, monkeypatch):
    run = make_run(tmp_path / "run", monkeypatch, resume_eval=False)
    reading, threads = threading.Event(), {"read": set(), "add": set()}
    real_read, real_add = window.read_window, reduce.StepAcc.add
    calls = []

    def read(*a, **k):
        threads["read"].add(threading.current_thread().name)
        if calls:
            reading.set()  # a read after the first batch's: the first add may end now
        return real_read(*a, **k)

    def add(self, df):
        threads["add"].add(threading.current_thread().name)
        calls.append(df.height)
        if len(calls) == 1:  # read-then-reduce would wait here for ever: the next read never starts
            assert reading.wait(timeout=30), "the next batch was not read while this one was reduced"
        return real_add(self, df)

    monkeypatch.setattr(window, "read_window", read)
    monkeypatch.setattr(reduce.StepAcc, "add", add)
    with warns_of_make_run():
        ingest_run(run, options=IngestOptions(chunk_rows=60))
    assert len(calls) > 2
    assert threads["add"].isdisjoint(threads["read"])


@pytest.mark.parametrize("chunk_rows", [60, 360])
def test_an_error_in_a_reduction_fails_the_ingest_and_publishes_nothing(tmp_path, monkeypatch, chunk_rows):
    run = make_run(tmp_path / "run", monkeypatch, resume_eval=False)
    n = {"calls": 0}
    real_add, real_reduce = reduce.StepAcc.add, window.reduce_steps

    def broken(real):
        def f(*a, **k):
            n["calls"] += 1
            if n["calls"] == 3:
                raise ZeroDivisionError("a broken reduction")
            return real(*a, **k)
        return f

    monkeypatch.setattr(reduce.StepAcc, "add", broken(real_add))
    monkeypatch.setattr(window, "reduce_steps", broken(real_reduce))
    with pytest.raises(ZeroDivisionError, match="a broken reduction"):
        ingest_run(run, options=IngestOptions(chunk_rows=chunk_rows))
    assert n["calls"] == 3
    ingested = os.path.join(run, "ingested")
    assert not os.path.exists(os.path.join(ingested, "ranks.parquet"))
    assert not os.path.exists(os.path.join(ingested, "steps.parquet"))


def test_the_reads_and_the_reductions_use_their_own_buffers(tmp_path, monkeypatch):
    """The coalescing of a read (its "key"/"v" buffers) must not write into a buffer a reduction
    on the other thread is using: each side gets its own Buffers."""
    run = make_run(tmp_path / "run", monkeypatch, resume_eval=True)
    owners: dict[int, set] = {}
    real = buffers.Buffers.get

    def get(self, role, dtype, n):
        owners.setdefault(id(self), set()).add(threading.current_thread().name)
        return real(self, role, dtype, n)

    monkeypatch.setattr(buffers.Buffers, "get", get)
    with warns_of_make_run():
        ingest_run(run, options=IngestOptions(chunk_rows=60))
    assert owners and all(len(names) == 1 for names in owners.values())
    assert pl.read_parquet(os.path.join(run, "ingested", "steps.parquet")).height == 70
