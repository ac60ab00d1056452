"""Every field the recorder writes, pinned value by value: the hot path may change (lock-free
end_step, inline captures), what lands in the Parquet shards may not. Also: a row appended to a
buffer after it was handed over (a thread that read the buffer before the swap) is still written."""

import os
import types

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from kforge_record import Recorder, recorder
from kforge_record.inbox import Inbox
from kforge_record.warn import Warner

pytestmark = pytest.mark.filterwarnings(r"ignore:kforge_record \(rank 0:RuntimeWarning")


def _fake_clocks(monkeypatch):
    ticks = {"perf": 0.0, "wall": 1_700_000_000.0}

    def perf_counter():
        ticks["perf"] += 0.25
        return ticks["perf"]

    def wall():
        ticks["wall"] += 1.0
        return ticks["wall"]

    monkeypatch.setattr(recorder, "perf_counter", perf_counter)
    monkeypatch.setattr(recorder, "time", types.SimpleNamespace(time=wall))


def test_every_field_of_every_row_is_written_as_before(tmp_path, monkeypatch):
    _fake_clocks(monkeypatch)
    rec = Recorder(tmp_path / "run", rank=0, world_size=1, install_sigterm_handler=False, hw_every_s=0,
                   hang_after_s=0, memory_every_steps=2)  # perf 0.25: the loop's start
    rec.start_step()  # 0.5
    with rec.phase("data"):  # 0.75 .. 1.0
        pass
    with rec.phase("data"):  # 1.25 .. 1.5: adds up within the step
        pass
    rec.end_step(1, loss=2.5, grad_norm=0.5, lr=1e-3, tokens=4096, **{"moe/aux": 0.125, "n": np.float32(1.5)})  # 1.75
    rec.log(1, **{"eval/loss": 0.25})  # perf 2.0 after the row
    rec.end_step(2, loss=torch.tensor(1.25), tokens=torch.tensor(7), **{"moe/aux": torch.tensor([0.5])})  # 2.25
    rec.end_step("x", loss=9.0)  # refused (2.5): no row, counted
    with rec.phase("optimizer"):  # 2.75 .. 3.0
        pass
    rec.end_step(3, loss=None, grad_norm=float("nan"), **{"": 1.0})  # 3.25 (from the refused call's 2.5); "" dropped
    rec.close()
    parts = sorted(os.path.join(rec.attempt_dir, n) for n in os.listdir(rec.attempt_dir) if n.startswith("part-"))
    table = pq.read_table(parts)
    assert table.schema.names == [
        "step", "time", "step_time_s", "loss", "grad_norm", "lr", "tokens", "mem_allocated_bytes", "mem_peak_bytes",
        "mem_reserved_bytes", "time/data_s", "moe/aux", "n", "eval/loss", "time/optimizer_s"]
    assert [str(t) for t in table.schema.types] == ["int64"] + ["double"] * 5 + ["int64"] * 4 + ["double"] * 5
    rows = table.to_pylist()
    nan = rows[3]["grad_norm"]
    assert nan != nan
    rows[3]["grad_norm"] = "nan"
    mem = dict.fromkeys(("mem_allocated_bytes", "mem_peak_bytes", "mem_reserved_bytes"))
    assert rows == [
        {"step": 1, "time": 1_700_000_001.0, "step_time_s": 1.25, "loss": 2.5, "grad_norm": 0.5, "lr": 1e-3,
         "tokens": 4096, **mem, "time/data_s": 0.5, "moe/aux": 0.125, "n": 1.5, "eval/loss": None,
         "time/optimizer_s": None},
        {"step": 1, "time": 1_700_000_002.0, "step_time_s": None, "loss": None, "grad_norm": None, "lr": None,
         "tokens": None, **mem, "time/data_s": None, "moe/aux": None, "n": None, "eval/loss": 0.25,
         "time/optimizer_s": None},
        {"step": 2, "time": 1_700_000_003.0, "step_time_s": 0.5, "loss": 1.25, "grad_norm": None, "lr": None,
         "tokens": 7, **mem, "time/data_s": None, "moe/aux": 0.5, "n": None, "eval/loss": None,
         "time/optimizer_s": None},
        {"step": 3, "time": 1_700_000_004.0, "step_time_s": 0.75, "loss": None, "grad_norm": "nan", "lr": None,
         "tokens": None, **mem, "time/data_s": None, "moe/aux": None, "n": None, "eval/loss": None,
         "time/optimizer_s": 0.25},
    ]
    assert rec.dropped_rows == 1
    with open(os.path.join(rec.attempt_dir, "heartbeat.bin"), "rb") as f:
        assert np.frombuffer(f.read()[8:], dtype="<i8,<f8")[0].tolist() == (3, 1_700_000_004.0)


def test_a_row_appended_to_a_list_after_the_writer_took_it_is_taken_next_time():
    inbox = Inbox(lag_rows=100, max_rows=1000, stall_s=2.0, warn=Warner("test"))
    buf = [(1,), (2,)]
    inbox.put(buf)
    assert inbox.take() == [(1,), (2,)]
    buf.append((3,))  # a thread that read the recorder's buffer before the hand-over swapped it
    inbox.done(2)
    inbox.put([(4,)])
    assert inbox.take() == [(3,), (4,)]
    inbox.done(2)
    assert inbox.pending_rows == 0 and inbox.waiting_rows == 0
