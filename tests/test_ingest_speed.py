"""What ingest does to be fast must not change what it finds: ranks.parquet says which float columns
may hold NaN/inf, and the nonfinite finding reads only those, with the same findings as a full read."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from findings_fixtures import Clock, close_all, drive, install, open_ranks

from kforge_dash import ingest_run
from kforge_dash.contract import RANKS_NONFINITE_KEY
from kforge_dash.ingest.findings.model import RunFacts
from kforge_dash.ingest.findings.nonfinite import nonfinite_findings
from kforge_dash.ingest.findings_options import FindingsOptions
from kforge_dash.ingest.ranks_writer import may_be_nonfinite


def _nan_run(tmp_path, monkeypatch):
    clock = install(monkeypatch, Clock())
    recs = open_ranks(tmp_path / "nan", 4)

    def values(r, s):  # rank 2's loss is NaN at step 30; every rank's grad norm is inf at 31
        return {"loss": float("nan") if (r, s) == (2, 30) else 1.0, "grad_norm": float("inf") if s == 31 else 0.5,
                "lr": 1e-3, "tokens": 10}

    drive(recs, range(1, 41), clock, phases=lambda r, s: [("data", 0.01), ("fwd_bwd", 0.09)], values=values)
    close_all(recs)
    return recs[0].run_dir


@pytest.mark.filterwarnings("ignore::kforge_dash.ingest.options.IngestWarning")
def test_ranks_parquet_names_exactly_the_float_columns_with_nan_or_inf(tmp_path, monkeypatch):
    run = _nan_run(tmp_path, monkeypatch)
    ingest_run(run)
    path = f"{run}/ingested/ranks.parquet"
    listed = json.loads(pq.read_metadata(path).metadata[RANKS_NONFINITE_KEY.encode()])
    assert listed == ["grad_norm", "loss"]
    df = pl.read_parquet(path)  # the claim holds for every other float column
    for c, dt in df.schema.items():
        if dt == pl.Float64 and c not in listed:
            assert df[c].drop_nulls().is_finite().all(), c


@pytest.mark.filterwarnings("ignore::kforge_dash.ingest.options.IngestWarning")
def test_nonfinite_findings_are_the_same_with_the_hint_and_without_it(tmp_path, monkeypatch):
    run = _nan_run(tmp_path, monkeypatch)
    ingest_run(run)
    steps = pl.read_parquet(f"{run}/ingested/steps.parquet")
    path = f"{run}/ingested/ranks.parquet"
    bare = str(tmp_path / "bare.parquet")  # the same rows from another writer: no key, every column read
    pq.write_table(pq.read_table(path).replace_schema_metadata(None), bare)

    def found(p):
        facts = RunFacts(steps=steps, ranks_path=p, launches=[], summary={}, opts=FindingsOptions(), phases=None,
                         hosts={})
        return sorted((f.metric, f.first_step, f.ranks, f.score, f.message) for f in nonfinite_findings(facts))

    with_hint = found(path)
    assert [m for m, *_ in with_hint] == ["grad_norm", "loss"]
    assert with_hint == found(bare)


def test_may_be_nonfinite_is_false_only_when_every_value_is_finite():
    assert not may_be_nonfinite(pa.chunked_array([[1.0, 2.0], [3.0]]))
    assert not may_be_nonfinite(pa.chunked_array([pa.array([], pa.float64())]))
    for bad in (float("nan"), float("inf"), -float("inf")):
        assert may_be_nonfinite(pa.chunked_array([[1.0], [2.0, bad]]))
    # A slice looks only at its own values, not at the buffer around it.
    arr = pa.array([np.nan, 1.0, 2.0, np.inf])
    assert not may_be_nonfinite(pa.chunked_array([arr.slice(1, 2)]))
    assert may_be_nonfinite(pa.chunked_array([arr.slice(2, 2)]))
    # Huge finite values whose sum overflows: a false alarm (the file is read), never a miss.
    assert may_be_nonfinite(pa.chunked_array([[1e308, 1e308]]))


def test_window_matrix_refuses_a_row_twice_where_another_is_missing():
    from kforge_dash.ingest.findings.matrix import Window

    steps, ranks = [1, 1, 2, 2], [0, 1, 0, 1]
    df = pl.DataFrame({"step": steps, "rank": ranks, "v": [1.0, 2.0, 3.0, 4.0]})
    win = Window.of(df.reverse())
    assert win.col("v").tolist() == [[1.0, 2.0], [3.0, 4.0]]  # steps x ranks, whatever the row order
    # (2, 1) missing and (1, 0) twice: as many rows as cells, but no matrix
    assert Window.of(df.with_columns(pl.Series("step", [1, 1, 2, 1]), pl.Series("rank", [0, 1, 0, 0]))) is None
    # ranks 0, 1, 3 (rank 2 recorded nothing): still a matrix, its columns the ranks present
    gap = Window.of(pl.DataFrame({"step": steps + [1, 2], "rank": ranks + [3, 3], "v": [1.0, 2, 3, 4, 5, 6]}))
    assert gap.ranks.tolist() == [0, 1, 3] and gap.col("v").tolist() == [[1.0, 2.0, 5.0], [3.0, 4.0, 6.0]]


@pytest.mark.filterwarnings("ignore::kforge_dash.ingest.options.IngestWarning")
def test_per_step_facts_are_the_same_in_many_windows_two_at_a_time(tmp_path, monkeypatch):
    from kforge_dash.ingest.findings import perstep
    from kforge_dash.ingest.findings.model import classify_phases

    run = _nan_run(tmp_path, monkeypatch)
    ingest_run(run)
    steps = pl.read_parquet(f"{run}/ingested/steps.parquet")
    o = FindingsOptions()
    facts = RunFacts(steps=steps, ranks_path=f"{run}/ingested/ranks.parquet", launches=[], summary={"ranks": [0, 1, 2, 3]},
                     opts=o, phases=classify_phases(steps.columns, o), hosts={})
    whole = perstep.per_step(facts)
    monkeypatch.setattr(perstep, "WINDOW_ROWS", 40)  # 5-step windows (one straggler block each)
    monkeypatch.setattr(perstep, "usable_cpus", lambda: 2)
    assert len(perstep.windows(facts, perstep.WINDOW_ROWS // 2)) == 9  # [0, 5), [5, 10) ... [40, 41)
    many = perstep.per_step(facts)
    for a, b in zip(whole, many):
        assert a.height and a.equals(b, null_equal=True)


def test_footers_sharing_a_schema_keep_their_own_facts_and_a_wrong_type_is_still_refused(tmp_path):
    from kforge_dash.ingest import parquet_io as footer_schema
    from kforge_dash.ingest.shards import read_part

    def part(name, steps, step_time):
        path = str(tmp_path / name)
        pq.write_table(pa.table({"step": pa.array(steps, pa.int64()), "step_time_s": step_time}), path)
        return path

    footer_schema._SCHEMA_FACTS.clear()
    a = part("a.parquet", [1, 2], pa.array([0.5, None], pa.float64()))
    b = part("b.parquet", [7, 9], pa.array([0.5, 0.5], pa.float64()))
    bad = part("bad.parquet", [3], pa.array([1], pa.int64()))  # step_time_s as int64: same names, other schema
    warnings = []
    pa_, pb, pbad = (read_part(p, 0, warnings) for p in (a, b, bad))
    assert len(footer_schema._SCHEMA_FACTS) == 2  # a and b share one entry
    assert (pa_.min_step, pa_.max_step, pa_.has_log_rows, pb.min_step, pb.max_step, pb.has_log_rows) == (1, 2, True, 7, 9, False)
    assert pa_.columns is pb.columns == {"step": "int64", "step_time_s": "double"}
    assert pbad is None and warnings == [f"{bad}: column 'step_time_s' is int64, expected double; skipped"]


def test_np_array_is_pa_array():
    from kforge_dash.ingest.arrays import np_array

    for values in (np.array([1.5, np.nan, -np.inf, 4.0]), np.arange(4, dtype=np.int64), np.arange(4, dtype=np.uint32),
                   np.arange(8, dtype=np.float64)[::2], np.array([], np.float64), np.array([True, False, True, True])):
        for mask in (None, np.array([False, True, False, True])[:len(values)], np.zeros(len(values), bool)):
            want, got = pa.array(values, mask=mask), np_array(values, mask)
            assert got.type == want.type and got.null_count == want.null_count
            assert got.is_valid().equals(want.is_valid())
            fill = False if values.dtype.kind == "b" else 0
            assert np.array_equal(got.fill_null(fill).to_numpy(zero_copy_only=False),
                                  want.fill_null(fill).to_numpy(zero_copy_only=False), equal_nan=values.dtype.kind == "f")
