"""The outputs: an unchanged run is skipped and a forced ingest gives the same files, new part files are
picked up, a copy reads back with pyarrow, ranks.parquet is in its documented order."""

import os
import shutil

import polars as pl
import pyarrow.parquet as pq
from ingest_fixtures import close_all, flush_all, open_ranks, read_outputs, run_steps
from parts_fixtures import make_run

from kforge_dash.ingest.options import IngestOptions
from kforge_dash.ingest.run import ingest_run


def test_idempotent_and_incremental(tmp_path, monkeypatch):
    run = str(tmp_path / "run")
    recs = open_ranks(run, 2)
    clock = run_steps(monkeypatch, recs, range(1, 15), step_time=lambda r, s: 1.0)
    flush_all(recs)
    first = ingest_run(run)
    steps1 = pl.read_parquet(os.path.join(run, "ingested", "steps.parquet"))
    ranks1 = pl.read_parquet(os.path.join(run, "ingested", "ranks.parquet"))
    again = ingest_run(run)
    assert again.skipped and not first.skipped  # unchanged shards: no work
    forced = ingest_run(run, options=IngestOptions(force=True))
    assert not forced.skipped
    steps2, ranks2, _ = read_outputs(run)
    assert steps2.equals(steps1) and ranks2.equals(ranks1)  # same shards, same data, same row order
    # the job goes on: new part files are picked up on the next ingest
    run_steps(monkeypatch, recs, range(15, 22), step_time=lambda r, s: 1.0, clock=clock)
    close_all(recs)
    third = ingest_run(run)
    assert not third.skipped
    steps3, ranks3, _ = read_outputs(run)
    assert steps3["step"].to_list() == list(range(1, 22)) and ranks3.height == 2 * 21
    assert steps3.head(14).select(steps1.columns).equals(steps1)
    # a different option is a different output: not skipped
    assert not ingest_run(run, options=IngestOptions(alpha=0.5)).skipped


def test_copy_of_run_reads_back_with_pyarrow(tmp_path, monkeypatch):
    run = make_run(tmp_path / "run", monkeypatch)
    ingest_run(run)
    copy = shutil.copytree(run, tmp_path / "copy")
    t = pq.read_table(os.path.join(copy, "ingested", "ranks.parquet"))
    assert t.schema.field("step").type == "int64" and t.schema.field("rank").type == "int64"
    assert t.num_rows == 40


def test_ranks_parquet_order_is_as_documented(tmp_path, monkeypatch):
    """docs/CONTRACT.md: by window, then attempt, then rank, then step (here: one window)."""
    run = str(tmp_path / "order")
    a0 = open_ranks(run, 2)
    clock = run_steps(monkeypatch, a0, range(1, 31), step_time=lambda r, s: 1.0)
    flush_all(a0)
    a1 = open_ranks(run, 2)  # resumes at 21
    run_steps(monkeypatch, a1, range(21, 41), step_time=lambda r, s: 1.0, clock=clock)
    close_all(a1)
    close_all(a0)
    ingest_run(run)
    _, ranks, _ = read_outputs(run)
    want = [(0, r, s) for r in (0, 1) for s in range(1, 21)] + [(1, r, s) for r in (0, 1) for s in range(21, 41)]
    assert list(zip(ranks["attempt"], ranks["rank"], ranks["step"])) == want
