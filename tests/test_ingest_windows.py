"""Many full (ranks x steps) windows in one ingest: the matrix path reuses its numpy buffers from
window to window, so every window's numbers must be its own (same as one big window, and as a
plain polars group-by over ranks.parquet); and each window's work is one function of plain values
(picklable, as a Dask worker runs it)."""

import os
import pickle

import polars as pl
import pytest
from ingest_fixtures import close_all, ingest_whole_and_windowed, open_ranks, run_steps
from parts_fixtures import make_run, read_outputs_by_path

import kforge_dash.ingest.run as ingest_mod
from kforge_dash.ingest.run import ingest_run


def test_many_matrix_windows_match_one_window_and_a_plain_group_by(tmp_path, monkeypatch):
    run = str(tmp_path / "grid")
    recs = open_ranks(run, 4, flush_every_steps=5)

    def values(r, s):
        v = {"loss": float(s + r), "tokens": 10 * (r + 1), "grad_norm": float(r + s), "lr": 0.1}
        if (s + r) % 3:
            v["aux"] = float(10 * s + r)  # a scalar with holes: null for some (rank, step)
        return v

    # 42 steps in parts of 5: windows of 5 steps (chunk_rows=20 below), the last one of 2 steps
    run_steps(monkeypatch, recs, range(1, 43), step_time=lambda r, s: 0.1 * (1 + (s * (r + 1)) % 5),
              values=values, flush_every=5)
    for r, rec in recs.items():
        rec.log(10, **{"eval/loss": float(r)})  # coalesced into the end_step row of step 10
    close_all(recs)

    (one_steps, one_ranks, _), (many_steps, many_ranks, _) = ingest_whole_and_windowed(run, 20)

    assert many_steps.height == 42
    assert many_steps.equals(one_steps)
    assert many_ranks.sort("step", "rank").equals(one_ranks.sort("step", "rank"))

    ref = (many_ranks.sort("rank").group_by("step", maintain_order=False)
           .agg(pl.col("step_time_s").max().alias("max"), pl.col("step_time_s").min().alias("min"),
                pl.col("step_time_s").median().alias("median"), pl.col("tokens").sum(),
                pl.col("loss").mean(), pl.col("aux").mean(), pl.col("eval/loss").mean(),
                pl.col("grad_norm").drop_nulls().first(), pl.len().alias("n"))
           .sort("step"))
    got = many_steps.sort("step")
    assert got["step"].to_list() == ref["step"].to_list() == list(range(1, 43))
    assert got["step_work_s"].to_list() == ref["max"].to_list()
    assert got["step_work_min_s"].to_list() == ref["min"].to_list()
    assert got["step_work_median_s"].to_list() == pytest.approx(ref["median"].to_list())
    assert got["tokens"].to_list() == ref["tokens"].to_list() == [100] * 42
    assert got["n_ranks"].to_list() == ref["n"].to_list() == [4] * 42
    assert got["loss"].to_list() == pytest.approx(ref["loss"].to_list())
    assert got["aux"].to_list() == pytest.approx(ref["aux"].to_list())
    assert got["grad_norm"].to_list() == ref["grad_norm"].to_list() == [float(s) for s in range(1, 43)]
    ev = got["eval/loss"].to_list()
    assert ev[9] == pytest.approx(1.5) and all(x is None for i, x in enumerate(ev) if i != 9)


def test_a_window_of_one_step_over_many_ranks_adds_them_in_rank_order(tmp_path, monkeypatch):
    """16 ranks, parts of steps 1-4, 5-8 and 9: with chunk_rows=64 step 9 is a window of its own.
    numpy sums a (16, 1) grid pairwise, not rank after rank: that window must still give the
    bits a whole-run window gives."""
    import numpy as np

    rng = np.random.default_rng(3)
    run = str(tmp_path / "one-step")
    recs = open_ranks(run, 16, flush_every_steps=4)
    run_steps(monkeypatch, recs, range(1, 10), step_time=lambda r, s: 0.1,
              values=lambda r, s: {"loss": float(rng.random() * 1e3), "tokens": 10, "x": float(rng.random())},
              flush_every=4)
    close_all(recs)
    (one_steps, _, _), (many_steps, _, _) = ingest_whole_and_windowed(run, 64)
    assert many_steps.equals(one_steps)
    ranks = pl.read_parquet(f"{run}/ingested/ranks.parquet").sort("rank")
    for s in (4, 9):
        total = 0.0
        for v in ranks.filter(pl.col("step") == s)["loss"].to_list():
            total += v  # rank after rank, as the contract says
        assert many_steps.filter(pl.col("step") == s)["loss"].item() == total / 16


def test_windows_end_inside_big_merged_parts(tmp_path, monkeypatch):
    """A merged part spans many steps (kforge_record/compact.py): windows must still hold about
    chunk_rows rows, cut inside it, or one window would hold the whole run."""
    import kforge_dash.ingest.inputs.read as read
    import kforge_dash.ingest.rowpass.rows as rows_mod

    run = str(tmp_path / "merged")
    recs = open_ranks(run, 3, flush_every_steps=2)
    run_steps(monkeypatch, recs, range(1, 201), step_time=lambda r, s: 0.1 * (1 + (s * (r + 1)) % 5), flush_every=2)
    close_all(recs)  # 100 flushes per rank: one part of 200 rows each
    monkeypatch.setattr(read, "_PIECE_ROWS", 16)  # (16k rows in real runs)
    planned = []
    real = rows_mod.plan_windows
    monkeypatch.setattr(rows_mod, "plan_windows", lambda *a: planned.append(real(*a)) or planned[-1])
    (one_steps, one_ranks, _), (many_steps, many_ranks, _) = ingest_whole_and_windowed(run, 60)
    assert len(planned[0]) == 1 and len(planned[1]) >= 5
    assert many_steps.height == 200 and many_steps.equals(one_steps)
    assert many_ranks.sort("step", "rank").equals(one_ranks.sort("step", "rank"))


def test_windows_end_where_a_merged_parts_row_groups_start(tmp_path, monkeypatch):
    """A window cut inside a row group decodes it twice (once per window); cut where the merged
    parts' row groups start (footer statistics), each window reads only its own groups."""
    import pyarrow.parquet as pq
    from ingest_fixtures import part_files

    import kforge_dash.ingest.rowpass.rows as rows_mod

    run = str(tmp_path / "merged")
    recs = open_ranks(run, 3, flush_every_steps=2)
    run_steps(monkeypatch, recs, range(1, 201), step_time=lambda r, s: 0.1 * (1 + (s * (r + 1)) % 5), flush_every=2)
    close_all(recs)  # 100 flushes per rank, merged by the recorder into one part of 200 rows
    parts = part_files(run)
    assert len(parts) == 3 and all("-" in p.rsplit("part-", 1)[1] for p in parts)
    for p in parts:  # the same rows in row groups of 50 (the recorder writes ~10k-row groups)
        pq.write_table(pq.read_table(p), p, row_group_size=50)
    planned = []
    real = rows_mod.plan_windows
    monkeypatch.setattr(rows_mod, "plan_windows", lambda *a: planned.append(real(*a)) or planned[-1])
    (one_steps, one_ranks, _), (many_steps, many_ranks, _) = ingest_whole_and_windowed(run, 120)
    assert planned[1] == [(1, 51), (51, 101), (101, 151), (151, 201)]
    assert many_steps.height == 200 and many_steps.equals(one_steps)
    assert many_ranks.sort("step", "rank").equals(one_ranks.sort("step", "rank"))


def test_the_window_work_is_one_function_of_plain_values(tmp_path, monkeypatch):
    from kforge_dash.ingest.inputs.plan import make_plan
    from kforge_dash.ingest.inputs.read import overlapping_parts
    from kforge_dash.ingest.run import WindowTask, ingest_window, plan_windows

    run = make_run(tmp_path / "run", monkeypatch, world=2)
    ingest_run(run)
    inputs = ingest_mod._list_inputs(run, os.path.join(run, "ingested"), ingest_mod.decide(ingest_mod.IngestOptions(), {}), [])
    plan = make_plan(inputs, [], force=True, chunk_rows=10)
    windows = plan_windows(plan.files, 10)
    assert len(windows) > 1
    tasks = [WindowTask(lo, hi, overlapping_parts(plan.files, lo, hi), plan.spec) for lo, hi in windows]
    got = [pickle.loads(pickle.dumps(ingest_window(pickle.loads(pickle.dumps(t))))) for t in tasks]
    steps = pl.concat([g.steps for g in got]).sort("step")
    want = read_outputs_by_path(run)[0].select(steps.columns)
    assert steps.equals(want)
    assert sum(g.rows.num_rows for g in got) == 40
