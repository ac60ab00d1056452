"""A rollback that stops below the step it went back from (issue 31): one Recorder runs steps 1-150,
reloads the step-100 checkpoint and runs 101-120, then the job ends. Steps 121-150 of the abandoned
pass are superseded too (superseded.parquet), not left on the kept line after 120 (docs/restarts.md
"Rollbacks in one process"); steps ended out of order lose no row."""

import math
import os

import polars as pl
import pytest
from findings_fixtures import Clock, install
from ingest_fixtures import close_all, open_ranks, read_outputs

from kforge_dash.ingest.options import IngestOptions
from kforge_dash.ingest.run import ingest_run

SHORT = list(range(1, 151)) + list(range(101, 121))  # back to 101 from 150, stopped at 120
TWICE = list(range(1, 151)) + list(range(101, 131)) + list(range(111, 121))  # back to 101, then to 111
DEEPER = list(range(1, 151)) + list(range(101, 131)) + list(range(51, 61))  # back to 101, then to 51


def _record(run, monkeypatch, order, *, world=2, seen=None, flush_every_steps=40, log_loss=False):
    """``order``: the steps ended, one after the other (1 s each; loss = pass * 1000 + step, a pass
    starting where a step was ended before). ``seen``: ingested after that many end_step calls too.
    ``log_loss``: the loss given by Recorder.log after end_step."""
    clock = install(monkeypatch, Clock())
    recs = open_ranks(run, world, flush_every_steps=flush_every_steps)
    clock.t += 5.0
    done, p = set(), 0
    for n, s in enumerate(order):
        if s in done:
            p, done = p + 1, set()
        done.add(s)
        for rec in recs.values():
            rec.start_step()
        clock.t += 1.0
        for rec in recs.values():
            loss = 1000.0 * p + s
            rec.end_step(s, tokens=10, **({} if log_loss else {"loss": loss}))
            if log_loss:
                rec.log(s, loss=loss)
        if seen is not None and n + 1 == seen:
            for rec in recs.values():
                rec.flush()
            ingest_run(run)
    close_all(recs)


@pytest.mark.parametrize(("chunk_rows", "log_loss"), [(None, False), (60, False), (None, True)])
def test_the_abandoned_steps_past_where_the_second_pass_stopped_are_superseded(tmp_path, monkeypatch, chunk_rows,
                                                                              log_loss):
    run = str(tmp_path / "rb")
    _record(run, monkeypatch, SHORT, log_loss=log_loss)
    ingest_run(run, options=IngestOptions(chunk_rows=chunk_rows) if chunk_rows else None)
    steps, ranks, summary = read_outputs(run)
    assert steps["step"].to_list() == list(range(1, 121))  # not 121-150 of the first pass after 120
    assert steps["loss"].to_list() == [float(s) for s in range(1, 101)] + [1000.0 + s for s in range(101, 121)]
    assert steps["step_time_s"].to_list() == pytest.approx([1.0] * 120)
    assert ranks.height == 240
    (r,) = summary["restarts"]
    assert (r["resumed_at_step"], r["previous_last_step"], r["superseded_steps"]) == (101, 150, 50)
    assert r["wasted_s"] == pytest.approx(50.0)
    (f,) = [f for f in summary["findings"] if f["kind"] == "restart"]
    assert "50 steps superseded, 20 of them run again (50.0 s of wasted progress)" in f["message"], f["message"]
    g = summary["goodput"]
    assert g["buckets"]["wasted_progress"] == pytest.approx(50.0) and g["wasted_steps"] == 50
    assert g["productive_s"] + sum(g["buckets"].values()) == pytest.approx(g["total_s"])
    sup = pl.read_parquet(os.path.join(run, "ingested", "superseded.parquet")).filter(pl.col("tag") == "loss").sort("step")
    assert sup["step"].to_list() == list(range(101, 151))
    assert sup["value"].to_list() == [float(s) for s in range(101, 151)]
    assert set(sup["superseded_at_step"].to_list()) == {101}


def test_the_branch_is_drawn_to_the_step_it_went_back_from(tmp_path, monkeypatch):
    from kforge_dash.browse.lineage import branches

    run = str(tmp_path / "rb")
    _record(run, monkeypatch, SHORT, world=1)
    ingest_run(run)
    steps, _, summary = read_outputs(run)
    kept = steps.select("step", "loss").with_columns(__x=pl.col("step"))
    (b,) = branches("rb", os.path.join(run, "ingested", "steps.parquet"), summary, ["loss"], kept, "step")
    assert list(b.x) == list(range(100, 151)) and list(b.y) == [float(s) for s in range(100, 151)]


@pytest.mark.parametrize(("order", "top", "went_back"), [
    ([1, 2, 3, 5, 4, 6], 6, []),  # out of order, never a rollback
    ([*range(1, 11), 12, 11, *range(13, 16)], 15, []),
    ([*range(1, 16), 11, 13, 12, *range(14, 19)], 18, [(11, 15)]),  # a rollback, then steps ended out of order
    ([*range(1, 16), 11, 13, 12, 14], 14, [(11, 15)]),  # the same, stopped below 15
])
def test_steps_ended_out_of_order_lose_no_row(tmp_path, monkeypatch, order, top, went_back):
    run = str(tmp_path / "ooo")
    _record(run, monkeypatch, order, world=1, flush_every_steps=4)
    ingest_run(run)
    steps, _, summary = read_outputs(run)
    assert steps["step"].to_list() == list(range(1, top + 1))
    back = order.index(11) if went_back else len(order)  # the kept line: the last pass's rows
    assert steps["loss"].to_list() == [float(s) + (1000.0 if s in order[back:] else 0.0) for s in range(1, top + 1)]
    assert [(r["resumed_at_step"], r["previous_last_step"]) for r in summary["restarts"]] == went_back


@pytest.mark.parametrize(("order", "seen", "top"), [(SHORT, 50, 120), (SHORT, 150, 120), (SHORT, 160, 120),
                                                    (TWICE, 170, 120), (TWICE, 185, 120), (DEEPER, 185, 60)])
def test_an_append_gives_what_a_full_ingest_gives(tmp_path, monkeypatch, order, seen, top):
    run = str(tmp_path / "rb")
    _record(run, monkeypatch, order, seen=seen, flush_every_steps=10)
    ingest_run(run)
    steps, _, summary = read_outputs(run)
    sup = pl.read_parquet(os.path.join(run, "ingested", "superseded.parquet"))
    ingest_run(run, options=IngestOptions(force=True))
    steps2, _, summary2 = read_outputs(run)
    assert steps2["step"].to_list() == list(range(1, top + 1))
    assert steps.select("step", "step_time_s", "loss").equals(steps2.select("step", "step_time_s", "loss"))
    assert summary["restarts"] == summary2["restarts"]
    assert summary["goodput"]["buckets"] == pytest.approx(summary2["goodput"]["buckets"])
    assert sup.equals(pl.read_parquet(os.path.join(run, "ingested", "superseded.parquet")))



@pytest.mark.parametrize(("order", "top", "wasted"), [(TWICE, 120, {101: 50.0, 111: 20.0}),
                                                      (DEEPER, 60, {101: 50.0, 51: 80.0})])
@pytest.mark.parametrize("chunk_rows", [None, 50])
def test_two_rollbacks_in_a_row_bring_back_no_abandoned_row(tmp_path, monkeypatch, order, top, wasted, chunk_rows):
    run = str(tmp_path / "rb")
    _record(run, monkeypatch, order, world=3)
    ingest_run(run, options=IngestOptions(chunk_rows=chunk_rows) if chunk_rows else None)
    steps, ranks, summary = read_outputs(run)
    assert steps["step"].to_list() == list(range(1, top + 1))
    assert ranks.group_by("rank").agg(pl.col("step").max())["step"].to_list() == [top] * 3
    assert ranks.height == 3 * top
    assert steps["step_time_s"].to_list() == pytest.approx([1.0] * top)
    last = {s: p for p, s in enumerate(_passes(order)) for s in s}  # each step's last pass
    assert steps["loss"].to_list() == [1000.0 * last[s] + s for s in range(1, top + 1)]
    assert {r["resumed_at_step"]: r["wasted_s"] for r in summary["restarts"]} == pytest.approx(wasted)
    assert not [w for w in summary["warnings"] if "zero or below" in w]
    sup = pl.read_parquet(os.path.join(run, "ingested", "superseded.parquet")).filter(pl.col("tag") == "loss")
    assert not sup.filter(pl.col("step") <= top).join(steps.select("step", pl.col("loss").alias("value")),
                                                      on=["step", "value"], how="semi").height  # kept ones not there


def _passes(order):
    out, done = [[]], set()
    for s in order:
        if s in done:
            out.append([])
            done = set()
        done.add(s)
        out[-1].append(s)
    return out


def test_a_failed_second_row_pass_keeps_every_last_output(tmp_path, monkeypatch):
    from kforge_dash.ingest.rowpass import rows as rows_mod

    run = str(tmp_path / "rb")
    _record(run, monkeypatch, SHORT, world=2)
    ingest_run(run)
    ing = os.path.join(run, "ingested")
    before = {n: open(os.path.join(ing, n), "rb").read() for n in sorted(os.listdir(ing)) if not n.startswith(".")}
    start = rows_mod.start_window

    def fail_in_the_tails_pass(task, **kw):
        if task.spec.tails is not None:
            raise OSError("disk gone")
        return start(task, **kw)

    monkeypatch.setattr(rows_mod, "start_window", fail_in_the_tails_pass)
    with pytest.raises(OSError, match="disk gone"):
        ingest_run(run, options=IngestOptions(force=True))
    after = {n: open(os.path.join(ing, n), "rb").read() for n in sorted(os.listdir(ing)) if not n.startswith(".")}
    assert after == before
    assert not [n for n in os.listdir(ing) if n.endswith(".tmp")]


def test_rows_without_an_end_time_keep_no_abandoned_row(tmp_path, monkeypatch):
    import glob

    import pyarrow as pa
    import pyarrow.parquet as pq

    run = str(tmp_path / "rb")
    _record(run, monkeypatch, SHORT, world=3, flush_every_steps=10)
    parts = sorted(glob.glob(os.path.join(run, "rank-00001", "**", "*.parquet"), recursive=True))
    for p in parts:  # rank 1's end times lost
        f = pq.ParquetFile(p)
        t = f.read()
        t = t.set_column(t.schema.get_field_index("time"), "time", pa.nulls(t.num_rows, pa.float64()))
        pq.write_table(t.replace_schema_metadata(f.schema_arrow.metadata), p)
    with pytest.warns(Warning):
        ingest_run(run)
    steps, ranks, summary = read_outputs(run)
    assert steps["step"].to_list() == list(range(1, 121))
    assert ranks.group_by("rank").agg(pl.col("step").max()).sort("rank")["step"].to_list() == [120] * 3
    assert ranks.filter(pl.col("rank") == 1)["loss"].to_list() == [float(s) for s in range(1, 101)] + [
        1000.0 + s for s in range(101, 121)]
    assert not steps["step_time_s"].is_nan().any()
    assert all(math.isfinite(r["wasted_s"]) for r in summary["restarts"])
    null = [w for w in summary["warnings"] if "no end time" in w]
    assert len(null) == 1 and "rank-00001" in null[0], summary["warnings"]
