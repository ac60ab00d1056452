"""The per-step findings computed beside the row pass (findings/tap.py): while the rows are still
being read, and the same bits as after the pass, or the after-the-pass way wherever in doubt."""

from __future__ import annotations

import json
import shutil
import threading

import numpy as np
import polars as pl
import pyarrow as pa
import pytest
from test_findings_perstep import PHASES, _bits, _facts, _grid

from kforge_dash import ingest_run
from kforge_dash.ingest import ranks_writer
from kforge_dash.ingest import run as run_mod
from kforge_dash.ingest.findings import perstep, tap, units
from kforge_dash.ingest.findings.model import Phases
from kforge_dash.ingest.ranks_writer import RanksWriter
from kforge_dash.progress import NullProgress


def _copy(name, tmp_path):
    dst = tmp_path / name
    shutil.copytree(f"sample_runs/{name}", dst, ignore=shutil.ignore_patterns("ingested"))
    return dst


def _no_tap_threads():
    return not [t for t in threading.enumerate() if t.name.startswith("kforge-perstep-tap")]


def test_units_are_computed_while_the_row_pass_still_reads(tmp_path, monkeypatch):
    # three row-pass windows (three units): the first unit's facts are computed before the last
    # window is read. The wait below only gives the tap's thread time: the first unit is
    # complete (the second window's rows are fed) before the first window is reported done.
    events, first = [], threading.Event()

    def on_unit(self, lo):
        events.append(("unit", lo))
        first.set()

    class Progress(NullProgress):
        def chunk(self, run_dir, done, total):
            if done == 1:
                assert first.wait(60)
            events.append(("window", done, total))

    monkeypatch.setattr(tap.PerStepTap, "on_unit", on_unit)
    ingest_run(_copy("four-ranks-stall", tmp_path), force=True, chunk_rows=300, progress=Progress())
    assert events[0] == ("unit", 1) and events.index(("window", 3, 3)) > 0
    assert [e for e in events if e[0] == "unit"] == [("unit", 1), ("unit", 75), ("unit", 149)]
    assert _no_tap_threads()


@pytest.mark.parametrize("name,chunk_rows", [("four-ranks-stall", 7), ("straggler", 300), ("spike-nan", 1_000_000)])
def test_findings_are_those_of_the_after_the_pass_way(tmp_path, monkeypatch, name, chunk_rows):
    # chunk_rows 7 and 300: units of 74 steps in blocks of 5 (a carry from unit to unit)
    used = []
    result = tap.PerStepTap.result
    monkeypatch.setattr(tap.PerStepTap, "result", lambda self, *a: used.append(result(self, *a)) or used[-1])
    got = ingest_run(_copy(name, tmp_path / "a"), force=True, chunk_rows=chunk_rows).summary
    assert used and used[0] is not None  # the tap's facts were the ones used
    monkeypatch.setattr(run_mod, "findings_tap", lambda *a: None)
    want = ingest_run(_copy(name, tmp_path / "b"), force=True, chunk_rows=chunk_rows).summary
    assert json.dumps(got["findings"]) == json.dumps(want["findings"]) and got["goodput"] == want["goodput"]
    assert got["findings"]  # (these runs have findings)


def test_a_failing_tap_costs_nothing_and_leaves_no_thread(tmp_path, monkeypatch):
    def boom(*a):
        raise RuntimeError("planted")

    want = ingest_run(_copy("straggler", tmp_path / "a"), force=True, chunk_rows=300).summary
    monkeypatch.setattr(tap.PerStepTap, "_unit", boom)  # the tap's per-unit work
    got = ingest_run(_copy("straggler", tmp_path / "b"), force=True, chunk_rows=300).summary
    assert got["findings"] == want["findings"] and not [w for w in got["warnings"] if "findings" in w]
    assert _no_tap_threads()


def test_a_failing_row_pass_leaves_no_thread(tmp_path):
    class Progress(NullProgress):
        def chunk(self, run_dir, done, total):
            if done == 2:
                raise KeyboardInterrupt  # (the row pass stops between windows)

    with pytest.raises(KeyboardInterrupt):
        ingest_run(_copy("four-ranks-stall", tmp_path), force=True, chunk_rows=300, progress=Progress())
    assert _no_tap_threads()


# --- tables fed as the ranks writer writes them: the tap gives units.py's bits, or None ----------

def _tapped(path, tables, *, W=None, phases=PHASES, tap_phases=None, written=None):
    """(tap's result, per_step by units or None, per_step by step windows) of ``tables`` fed to a
    tap and written by the ranks writer (``written``: other tables in the file than those fed)."""
    facts = _facts(path, written or tables)  # (the steps; its file is written again below)
    facts.phases = phases
    W0 = perstep.block_size(facts.steps.height)
    t = tap.PerStepTap(tap_phases or phases, W or W0, threads=2, span_rows=60)
    t.begin()
    w = RanksWriter(str(path))
    for table in written or tables:
        w.put(table)
    w.close()
    for table in tables:
        t.feed(table)
    t.end()
    st = facts.steps.select("step", pl.col("step_time_median_s").alias("_st"))
    got = t.result(facts, st, W0)
    t.close()
    fast = perstep._by_units(facts, st, W0)
    return got, fast, st, facts


def _slow(monkeypatch, facts):
    monkeypatch.setattr(perstep, "WINDOW_ROWS", 60)
    monkeypatch.setattr(units, "plan", lambda path: None)
    return perstep.per_step(facts)


SPANS = [range(3, 300), range(300, 413), range(413, 1250)]  # blocks of 13 cut across units (carries)


# one own-work phase: the tap copies its columns from the Arrow buffers; two: polars sums them
ONE_OWN = Phases(own=("time/data_s",), wait=("time/fwd_bwd_s",), data=("time/data_s",), checkpoint=("time/checkpoint_s",),
                 eval=())


@pytest.mark.parametrize("phases", [PHASES, ONE_OWN], ids=["two own phases", "one"])
@pytest.mark.parametrize("group_rows,grid,logs", [(1 << 20, True, False), (837, True, False), (100, False, False),
                                                  (1 << 20, True, True)])
def test_fed_tables_give_the_step_windows_bits(tmp_path, monkeypatch, phases, group_rows, grid, logs):
    # 837 rows: the last unit's tables of two ranks in two row groups (a rank each); 100: row
    # groups cut a rank's steps (not a grid: no tap, no units); logs: each table also holds rows of
    # steps no rank ended (as log rows), which both leave out
    monkeypatch.setattr(ranks_writer, "ROW_GROUP_ROWS", group_rows)
    thirds = ([0, 2], [3, 7], [8, 11])
    tables = [_grid(rs, sp, seed=i * 3 + j) for i, sp in enumerate(SPANS) for j, rs in enumerate(thirds)]
    if logs:
        tables = [pa.concat_tables([t, t.slice(5, 3).set_column(3, "step_time_s", pa.nulls(3, pa.float64()))])
                  for t in tables]
    by_polars = []
    group = units.Reader.group
    monkeypatch.setattr(units.Reader, "group", lambda self, *a: by_polars.append(threading.current_thread().name)
                        or group(self, *a))
    got, fast, _, facts = _tapped(tmp_path / "ranks.parquet", tables, phases=phases)
    assert (got is not None) == (fast is not None) == grid
    if grid:
        slow = _slow(monkeypatch, facts)
        assert _bits(pl.concat(got[0])) == _bits(slow[0]) and _bits(pl.concat(got[1])) == _bits(slow[1])
        assert ("kforge-perstep-tap" in by_polars) == (phases is PHASES or logs)


@pytest.mark.parametrize("case", ["missing", "attempts", "null", "order", "gap", "step-major", "block size", "phases",
                                  "written otherwise", "too big here", "too many pieces", "empty"])
@pytest.mark.parametrize("phases", [PHASES, ONE_OWN], ids=["two own phases", "one"])
def test_the_tap_steps_aside_where_in_doubt(tmp_path, monkeypatch, case, phases):
    a, b = _grid([0, 1, 2], range(1, 13), seed=1), _grid([0, 1, 2], range(13, 30), seed=2)
    kw = {"phases": phases}
    if case == "missing":  # rank 1 lacks step 20
        b = b.filter(pa.compute.invert(pa.compute.and_(pa.compute.equal(b["rank"], 1), pa.compute.equal(b["step"], 20))))
    elif case == "attempts":
        b = _grid([0, 1, 2], range(13, 30), attempt=1, seed=2)
    elif case == "null":
        b = b.set_column(4, "time/data_s", pa.array([None] + b["time/data_s"].to_pylist()[1:], pa.float64()))
    elif case == "order":
        a, b = b, a
    elif case == "gap":
        b = _grid([0, 1, 2], range(15, 30), seed=2)
    elif case == "step-major":
        b = b.sort_by([("step", "ascending"), ("rank", "ascending")])
    elif case == "block size":  # the plan's guess of the steps was wrong
        kw["W"] = 7
    elif case == "phases":
        kw["tap_phases"] = Phases(own=phases.own, wait=(), data=phases.data, checkpoint=phases.checkpoint, eval=())
    elif case == "written otherwise":  # the file's row groups are not the tables fed
        kw["written"] = [pa.concat_tables([a, b])]
    elif case == "too big here":
        monkeypatch.setattr(tap, "UNIT_BYTES", 100)
    elif case == "too many pieces":  # units.py would read step windows
        monkeypatch.setattr(units, "UNIT_BYTES", 10)
    got, fast, _, facts = _tapped(tmp_path / "ranks.parquet", [a, b.slice(0, 0)] if case == "empty" else [a, b], **kw)
    assert got is None
    if case not in ("block size", "phases", "written otherwise", "too big here", "empty"):
        assert fast is None  # the tap steps aside exactly where units.py does


def test_no_thread_to_be_had_costs_nothing(tmp_path, monkeypatch):
    # the tap's thread cannot start: the row pass is never held up (feed waits for no one)
    want = ingest_run(_copy("four-ranks-stall", tmp_path / "a"), force=True, chunk_rows=7).summary

    class NoThread(threading.Thread):
        def start(self):
            if self.name == "kforge-perstep-tap":
                raise RuntimeError("can't start new thread")
            super().start()

    monkeypatch.setattr(tap.threading, "Thread", NoThread)
    got = ingest_run(_copy("four-ranks-stall", tmp_path / "b"), force=True, chunk_rows=7).summary
    assert got["findings"] == want["findings"] and got["goodput"] == want["goodput"]


def _with_nulls(t: pa.Table, name: str, every: int) -> pa.Table:
    """``t`` with a column ``name`` (added if absent) null but every ``every``-th row."""
    n = t.num_rows
    values = pa.array(np.linspace(0.0, 1.0, n), mask=np.arange(n) % every != 0)
    i = t.schema.get_field_index(name)
    return t.set_column(i, name, values) if i >= 0 else t.append_column(name, values)


@pytest.mark.parametrize("wait", [("time/fwd_bwd_s",), ()], ids=["a wait phase with nulls", "no wait phase"])
def test_the_arrow_copy_fills_nulls_as_polars_does(tmp_path, monkeypatch, wait):
    # The Arrow-copy way (one own-work phase) with what the other tests lack: a wait phase null in
    # most rows (0.0 there, as perstep.own_work(...).fill_null(0.0)), or none at all (0.0
    # throughout), and an eval phase null in most rows (NaN there, as a side column)
    phases = Phases(own=("time/data_s",), wait=wait, data=("time/data_s",), checkpoint=("time/checkpoint_s",),
                    eval=("time/eval_s",))
    tables = [_with_nulls(_with_nulls(_grid(rs, sp, seed=i * 3 + j), "time/fwd_bwd_s", 3), "time/eval_s", 5)
              for i, sp in enumerate(SPANS) for j, rs in enumerate(([0, 2], [3, 7]))]
    by_polars = []
    group = units.Reader.group
    monkeypatch.setattr(units.Reader, "group", lambda self, *a: by_polars.append(threading.current_thread().name)
                        or group(self, *a))
    got, fast, _, facts = _tapped(tmp_path / "ranks.parquet", tables, phases=phases)
    assert got is not None and fast is not None and "kforge-perstep-tap" not in by_polars  # (the Arrow copy ran)
    slow = _slow(monkeypatch, facts)
    assert _bits(pl.concat(got[0])) == _bits(slow[0]) and _bits(pl.concat(got[1])) == _bits(slow[1])
