"""Re-ingest after new part files (a running job between two --watch polls): only the new parts
are read, on top of the last outputs, and the result is the same as a full ingest from scratch.
Cases an append cannot reproduce exactly must fall back to a full ingest, and say so."""

import os
from contextlib import nullcontext

import polars as pl
import pytest
from ingest_fixtures import assert_same, close_all, flush_all, full_outputs, open_ranks, part_files, read_outputs, run_steps

from kforge_dash.ingest.options import IngestOptions, IngestWarning
from kforge_dash.ingest.run import ingest_run

pytestmark = pytest.mark.usefixtures("closes_recorders")  # the job between two ingests stays open

def values(r, s):
    return {"loss": 1.0 / s + r, "tokens": 100 * (r + 1), "grad_norm": float(s), "lr": 0.1, "aux": float(s * r)}


def test_new_parts_are_appended_and_match_a_full_ingest(tmp_path, monkeypatch):
    run = str(tmp_path / "live")
    recs = open_ranks(run, 3, flush_every_steps=10**6)
    clock = run_steps(monkeypatch, recs, range(1, 31), step_time=lambda r, s: 0.1 + 0.01 * r, values=values)
    recs[0].flush()
    recs[1].flush()  # rank 2 lags: steps 1..30 of rank 2 arrive only after the first ingest
    first = ingest_run(run)
    assert not first.appended and first.summary["steps"] == 30
    assert first.summary["ranks"] == [0, 1]

    run_steps(monkeypatch, recs, range(31, 61), step_time=lambda r, s: 0.2, values=values, clock=clock)
    flush_all(recs)
    res = ingest_run(run)
    assert res.appended and not res.skipped
    got = read_outputs(run)
    steps, ranks, summary = got
    assert steps["step"].to_list() == list(range(1, 61))
    assert steps["n_ranks"].to_list() == [3] * 60  # steps 1..30 were rank 0 and 1 only, now all three
    assert summary["ranks"] == [0, 1, 2] and ranks.height == 180
    assert_same(got, full_outputs(run))


def test_append_in_many_windows_and_tokens_that_do_not_count(tmp_path, monkeypatch):
    run = str(tmp_path / "win")
    recs = open_ranks(run, 4, flush_every_steps=5)
    recs[3] = recs[3]  # rank 3 is a pipeline stage whose tokens do not count toward the global count
    close_all({3: recs.pop(3)})
    recs[3] = open_ranks(run, 4, ranks=[3], flush_every_steps=5, counts_tokens=False)[3]
    clock = run_steps(monkeypatch, recs, range(1, 23), step_time=lambda r, s: 0.1 * (1 + (s + r) % 4),
                      values=values, flush_every=5)
    ingest_run(run, options=IngestOptions(chunk_rows=12))
    run_steps(monkeypatch, recs, range(23, 51), step_time=lambda r, s: 0.1 * (1 + (s * r) % 3),
              values=values, clock=clock, flush_every=5)
    flush_all(recs)
    res = ingest_run(run, options=IngestOptions(chunk_rows=12))
    assert res.appended
    got = read_outputs(run)
    assert got[0]["step"].to_list() == list(range(1, 51))
    assert_same(got, full_outputs(run, chunk_rows=12))


def test_a_late_eval_log_is_coalesced_into_the_row_already_ingested(tmp_path, monkeypatch):
    run = str(tmp_path / "eval")
    recs = open_ranks(run, 2, flush_every_steps=10**6)
    clock = run_steps(monkeypatch, recs, range(1, 21), step_time=lambda r, s: 0.1, values=values)
    flush_all(recs)
    ingest_run(run)
    for r, rec in recs.items():
        rec.log(20, **{"eval/loss": 2.0 + r})  # eval after end_step(20), flushed into the next part
    run_steps(monkeypatch, recs, range(21, 26), step_time=lambda r, s: 0.1, values=values, clock=clock)
    flush_all(recs)
    res = ingest_run(run)
    assert res.appended
    got = read_outputs(run)
    ev = got[0].filter(pl.col("step") == 20)["eval/loss"].item()
    assert ev == pytest.approx(2.5)
    assert got[1].filter(pl.col("step_time_s").is_null()).height == 0  # no stray log-only rows
    assert_same(got, full_outputs(run))


@pytest.mark.parametrize("case", ["rollback", "relog"])
def test_what_an_append_cannot_reproduce_falls_back_to_a_full_ingest(tmp_path, monkeypatch, case):
    run = str(tmp_path / case)
    recs = open_ranks(run, 2, flush_every_steps=10**6)
    clock = run_steps(monkeypatch, recs, range(1, 21), step_time=lambda r, s: 0.1, values=values)
    if case == "relog":
        for r, rec in recs.items():
            rec.log(20, **{"eval/loss": 1.0})
    flush_all(recs)
    ingest_run(run)
    if case == "rollback":  # the loop went back to step 16 (in-process rollback) in a new part
        run_steps(monkeypatch, recs, range(16, 26), step_time=lambda r, s: 0.3, values=values, clock=clock)
    else:  # the same scalar logged again for step 20: a full ingest keeps the last logged value
        for r, rec in recs.items():
            rec.log(20, **{"eval/loss": 3.0})
    flush_all(recs)
    with pytest.warns(IngestWarning, match="logged with different values") if case != "rollback" else nullcontext():
        res = ingest_run(run)  # a rollback is a restart (rollbacks.py): no warning
    assert not res.appended and not res.skipped
    got = read_outputs(run)
    if case == "rollback":
        assert got[0].filter(pl.col("step") == 18)["step_work_s"].item() == pytest.approx(0.3)  # last written wins
        assert [(r["resumed_at_step"], r["why"]) for r in got[2]["restarts"]] == [(16, "rollback")]
    else:
        assert got[0].filter(pl.col("step") == 20)["eval/loss"].item() == pytest.approx(3.0)
    assert_same(got, full_outputs(run))


@pytest.mark.parametrize("change", ["restart", "part-touched", "manifest-deleted",
                                    "manifest-corrupt", "ranks-replaced", "alpha"])
def test_anything_but_new_parts_means_a_full_ingest(tmp_path, monkeypatch, change):
    run = str(tmp_path / change)
    recs = open_ranks(run, 2, flush_every_steps=10**6)
    clock = run_steps(monkeypatch, recs, range(1, 21), step_time=lambda r, s: 0.1, values=values)
    flush_all(recs)
    ingest_run(run)
    ing = os.path.join(run, "ingested")
    kw = {}
    if change == "restart":  # a new launch resumes at step 15: rows of the old one from 15 on are superseded
        close_all(recs)
        recs = open_ranks(run, 2, flush_every_steps=10**6)
        run_steps(monkeypatch, recs, range(15, 31), step_time=lambda r, s: 0.5, values=values, clock=clock)
    elif change == "new-column":
        run_steps(monkeypatch, recs, range(21, 31), step_time=lambda r, s: 0.1, clock=clock,
                  values=lambda r, s: dict(values(r, s), newcol=1.0))
    else:
        run_steps(monkeypatch, recs, range(21, 31), step_time=lambda r, s: 0.1, values=values, clock=clock)
    flush_all(recs)
    if change == "part-touched":
        p = part_files(run)[0]
        os.utime(p, ns=(os.stat(p).st_atime_ns, os.stat(p).st_mtime_ns + 10**9))
    elif change == "manifest-deleted":
        os.remove(os.path.join(ing, "manifest.parquet"))
    elif change == "manifest-corrupt":
        with open(os.path.join(ing, "manifest.parquet"), "wb") as f:
            f.write(b"PAR1 not really")
    elif change == "ranks-replaced":  # someone rewrote ranks.parquet: never append to it
        pl.read_parquet(os.path.join(ing, "ranks.parquet")).head(3).write_parquet(os.path.join(ing, "ranks.parquet"))
    elif change == "alpha":
        kw["alpha"] = 0.5
    res = ingest_run(run, options=IngestOptions(**kw))
    assert not res.appended and not res.skipped
    got = read_outputs(run)
    assert got[0]["step"].max() == 30 and got[1].height == 60
    assert_same(got, full_outputs(run, **kw))


def test_only_end_json_new_keeps_the_outputs_and_redoes_the_summary(tmp_path, monkeypatch):
    run = str(tmp_path / "closed")
    recs = open_ranks(run, 2, flush_every_steps=10**6)
    run_steps(monkeypatch, recs, range(1, 11), step_time=lambda r, s: 0.1, values=values)
    flush_all(recs)
    ingest_run(run)
    ranks_before = os.stat(os.path.join(run, "ingested", "ranks.parquet")).st_mtime_ns
    close_all(recs)  # writes end.json, no new rows
    res = ingest_run(run)
    assert res.appended and not res.skipped
    assert os.stat(os.path.join(run, "ingested", "ranks.parquet")).st_mtime_ns == ranks_before
    assert_same(read_outputs(run), full_outputs(run))


def test_a_corrupt_part_stays_reported_across_appends(tmp_path, monkeypatch):
    run = str(tmp_path / "corrupt")
    recs = open_ranks(run, 2, flush_every_steps=5)
    clock = run_steps(monkeypatch, recs, range(1, 21), step_time=lambda r, s: 0.1, values=values, flush_every=5)
    bad = part_files(run)[1]
    with open(bad, "r+b") as f:
        f.truncate(os.path.getsize(bad) // 2)
    with pytest.warns(IngestWarning, match="corrupt"):
        first = ingest_run(run)
    assert any(bad in w and "corrupt" in w for w in first.summary["warnings"])
    run_steps(monkeypatch, recs, range(21, 31), step_time=lambda r, s: 0.1, values=values, clock=clock, flush_every=5)
    with pytest.warns(IngestWarning, match="corrupt"):
        res = ingest_run(run)
    assert res.appended
    assert any(bad in w and "corrupt" in w for w in res.summary["warnings"])
    assert_same(read_outputs(run), full_outputs(run))


def test_an_unchanged_run_is_still_skipped(tmp_path, monkeypatch):
    run = str(tmp_path / "same")
    recs = open_ranks(run, 2)
    run_steps(monkeypatch, recs, range(1, 11), step_time=lambda r, s: 0.1, values=values)
    close_all(recs)
    ingest_run(run)
    res = ingest_run(run)
    assert res.skipped and not res.appended


def scribble(path):
    """Damage a part's data pages and keep its footer: only reading its rows tells."""
    data = bytearray(open(path, "rb").read())
    data[4:200] = b"\xff" * 196
    with open(path, "wb") as f:
        f.write(bytes(data))


def test_a_new_column_takes_its_full_ingest_place(tmp_path, monkeypatch):
    run = str(tmp_path / "cols")
    recs = open_ranks(run, 2, flush_every_steps=10**6)
    clock = run_steps(monkeypatch, recs, range(1, 11), step_time=lambda r, s: 0.1,
                      values=lambda r, s: {"loss": 1.0 / s, "tokens": 100, "zeta": 1.0})
    flush_all(recs)
    ingest_run(run)
    run_steps(monkeypatch, recs, range(11, 21), step_time=lambda r, s: 0.1, clock=clock,
              values=lambda r, s: {"loss": 1.0 / s, "tokens": 100, "zeta": 1.0, "alpha_new": 2.0})
    flush_all(recs)
    assert ingest_run(run).appended
    got = read_outputs(run)
    assert got[0].columns.index("alpha_new") < got[0].columns.index("zeta")  # sorted, as a full ingest does
    assert got[0]["alpha_new"].to_list() == [None] * 10 + [2.0] * 10
    assert_same(got, full_outputs(run))


def test_new_parts_that_fail_to_decode_are_skipped_and_the_old_rows_kept(tmp_path, monkeypatch):
    run = str(tmp_path / "bad-new")
    recs = open_ranks(run, 2, flush_every_steps=10**6)
    clock = run_steps(monkeypatch, recs, range(1, 11), step_time=lambda r, s: 0.1, values=values)
    flush_all(recs)
    ingest_run(run)
    before = set(part_files(run))
    run_steps(monkeypatch, recs, range(11, 21), step_time=lambda r, s: 0.1, values=values, clock=clock)
    close_all(recs)  # the node lost power while the last parts were written
    for p in sorted(set(part_files(run)) - before):
        scribble(p)
    with pytest.warns(IngestWarning, match="corrupt part file"):
        res = ingest_run(run)
    assert res.appended and res.summary["steps"] == 10
    assert sum("corrupt part file" in w for w in res.summary["warnings"]) == 2
    assert ingest_run(run).skipped  # and the next poll has nothing to redo
    assert_same(read_outputs(run), full_outputs(run))


def test_a_restart_whose_first_parts_are_corrupt_plans_as_a_full_ingest(tmp_path, monkeypatch):
    run = str(tmp_path / "bad-restart")
    recs = open_ranks(run, 2, flush_every_steps=10**6)
    clock = run_steps(monkeypatch, recs, range(1, 21), step_time=lambda r, s: 0.1, values=values)
    close_all(recs)
    recs = open_ranks(run, 2, flush_every_steps=10**6)  # resumes from the step-14 checkpoint
    before = set(part_files(run))
    run_steps(monkeypatch, recs, range(15, 20), step_time=lambda r, s: 0.5, values=values, clock=clock)
    flush_all(recs)
    for p in sorted(set(part_files(run)) - before):
        scribble(p)
    with pytest.warns(IngestWarning, match="corrupt part file"):
        first = ingest_run(run)
    assert first.summary["restarts"][0]["resumed_at_step"] == 15  # from the footers, rows unreadable
    run_steps(monkeypatch, recs, range(20, 26), step_time=lambda r, s: 0.5, values=values, clock=clock)
    flush_all(recs)
    with pytest.warns(IngestWarning, match="corrupt part file"):
        res = ingest_run(run)
    assert res.appended
    assert_same(read_outputs(run), full_outputs(run))


def test_a_footer_that_failed_to_read_once_is_read_again(tmp_path, monkeypatch):
    import kforge_dash.ingest.inputs.parquet_io as footers  # where shards.read_part opens a footer

    run = str(tmp_path / "flaky")
    recs = open_ranks(run, 2, flush_every_steps=10**6)
    clock = run_steps(monkeypatch, recs, range(1, 11), step_time=lambda r, s: 0.1, values=values)
    flush_all(recs)
    victim = part_files(run)[0]
    real = footers.read_metadata

    def flaky(path, *a, **k):
        if str(path) == victim:
            raise OSError(5, "Input/output error")  # e.g. a network file system hiccup
        return real(path, *a, **k)

    monkeypatch.setattr(footers, "read_metadata", flaky)
    with pytest.warns(IngestWarning, match="Input/output error"):
        first = ingest_run(run)
    assert first.summary["ranks"] == [1]
    monkeypatch.setattr(footers, "read_metadata", real)
    run_steps(monkeypatch, recs, range(11, 21), step_time=lambda r, s: 0.1, values=values, clock=clock)
    flush_all(recs)
    res = ingest_run(run)
    assert res.summary["ranks"] == [0, 1] and res.summary["steps"] == 20
    got = read_outputs(run)
    assert got[0]["n_ranks"].to_list() == [2] * 20
    assert_same(got, full_outputs(run))


def test_means_are_bit_identical_whichever_window_a_step_falls_in(tmp_path, monkeypatch):
    """Random floats over 8 ranks: the matrix and group-by paths add ranks in one order, so an append (its windows
    start elsewhere) gives the very same bits (and the same bitwise OR of a bitmask column)."""
    import numpy as np

    rng = np.random.default_rng(1)
    run = str(tmp_path / "bits")
    recs = open_ranks(run, 8, flush_every_steps=10**6)
    for rec in recs.values():
        rec.log(0, warmup=1.0)  # a log-only row at step 0: its window takes the group-by path

    def vals(r, s):
        v = {"loss": float(rng.random() * 10), "tokens": 100, "aux": float(rng.random() * 1e3)}
        if (r + s) % 3:  # a bitmask (OR over ranks, int64), with holes
            v["hw/throttle_reasons"] = float(1 << int(rng.integers(0, 12)))
        return v

    clock = run_steps(monkeypatch, recs, range(1, 21), values=vals, step_time=lambda r, s: float(rng.random()))
    flush_all(recs)
    ingest_run(run)
    run_steps(monkeypatch, recs, range(21, 41), values=vals, step_time=lambda r, s: float(rng.random()), clock=clock)
    flush_all(recs)
    assert ingest_run(run).appended
    assert read_outputs(run)[0].schema["hw/throttle_reasons"] == pl.Int64
    assert_same(read_outputs(run), full_outputs(run))
    assert_same(read_outputs(run), full_outputs(run, chunk_rows=24))  # and any window cut


def test_footers_read_by_worker_processes_give_the_same_ingest(tmp_path, monkeypatch):
    import sys

    import kforge_dash.ingest.inputs.manifest as ingest_state

    run = str(tmp_path / "many")
    recs = open_ranks(run, 3, flush_every_steps=4, merge_parts=False)  # many small footers
    run_steps(monkeypatch, recs, range(1, 41), step_time=lambda r, s: 0.1 + 0.01 * r, values=values, flush_every=4)
    close_all(recs)
    bad = part_files(run)[3]
    with open(bad, "r+b") as f:
        f.truncate(100)  # a footer that cannot be read: its warning must come back from the worker
    want = full_outputs(run)
    import kforge_dash.ingest.inputs.shards as shards

    real = shards.read_part

    def not_here(*a, **k):
        raise AssertionError("footer read in the parent process")

    monkeypatch.setattr(ingest_state, "PARALLEL_MIN_PARTS", 1)
    monkeypatch.setattr(shards, "read_part", not_here)  # the workers (fresh interpreters) read them all
    got = full_outputs(run)
    assert any(bad in w for w in got[2]["warnings"])
    assert_same(got, want)
    monkeypatch.setattr(shards, "read_part", real)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-python"))  # workers cannot start: read here
    assert_same(full_outputs(run), want)


@pytest.mark.parametrize("row_group_rows", [8192, 7])
def test_appends_stay_appends_while_the_recorder_merges_its_parts(tmp_path, monkeypatch, row_group_rows):
    """Merges of parts an ingest already read are not changed parts: each pass reads only the rows after the last
    one, also out of a merged part that holds old and new rows (kforge_record/compact.py). With row groups of 7
    rows a merged part has many, and windows end where they start (read.py): never below the append's rows."""
    import kforge_dash.ingest.inputs.plan as plan_mod
    import kforge_record.compact as compact

    monkeypatch.setattr(compact, "ROW_GROUP_ROWS", row_group_rows)

    starts = []
    real = plan_mod.plan_append

    def spy(*a, **k):
        plan = real(*a, **k)
        starts.append(None if plan is None else plan.start)
        return plan

    monkeypatch.setattr(plan_mod, "plan_append", spy)
    run = str(tmp_path / "merging")
    recs = open_ranks(run, 2, flush_every_steps=3)
    clock = run_steps(monkeypatch, recs, range(1, 13), step_time=lambda r, s: 0.1, values=values, flush_every=3)
    assert not ingest_run(run).appended  # flushes 0-3 of each rank: four parts
    done = 12
    # 45: flushes 0-9 merged (four read, six new); 60: no merge; 300: a tier-2 merge of 0-99 with
    # 80 of them read; 303: the rows of one new part only.
    for stop in (45, 60, 300, 303):
        clock = run_steps(monkeypatch, recs, range(done + 1, stop + 1), step_time=lambda r, s: 0.1 + 0.01 * r,
                          values=values, flush_every=3, clock=clock)
        res = ingest_run(run)
        assert res.appended and starts[-1] == done + 1, (stop, starts)
        assert_same(read_outputs(run), full_outputs(run))
        done = stop
    names = sorted(os.path.basename(p) for p in part_files(os.path.join(run, "rank-00000")))
    assert names == ["part-000000-000099.parquet", "part-000100.parquet"]
    close_all(recs)
