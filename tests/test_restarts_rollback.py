"""An in-process rollback (one Recorder: steps 1-150, the step-100 checkpoint reloaded, steps 101-200) is a
restart like a relaunch: a restarts entry, wasted progress, the restart finding, the superseded steps kept and
drawn (docs/restarts.md "Rollbacks in one process"); a plain duplicate keeps its warning."""

import json
import os
import warnings

import polars as pl
import pytest
from chart_specs import chart_specs
from findings_fixtures import Clock, install
from ingest_fixtures import close_all, open_ranks, read_outputs

from kforge_dash.ingest.options import IngestOptions
from kforge_dash.ingest.run import ingest_run


def _rollback_run(run, monkeypatch, *, world=2, chunk_rows=None, log_loss=False):
    """Steps 1-150 (loss = step), reload step 100, steps 101-200 (loss = 1000 + step); 1 s steps on one clock.
    ``log_loss``: the loss given by Recorder.log after end_step (as framework adapters do), not by end_step."""
    clock = install(monkeypatch, Clock())
    recs = open_ranks(run, world, flush_every_steps=40)
    clock.t += 5.0
    for n, s in enumerate(list(range(1, 151)) + list(range(101, 201))):
        second = n >= 150
        for rec in recs.values():
            rec.start_step()
        clock.t += 1.0
        for rec in recs.values():
            loss = (1000.0 if second else 0.0) + s
            rec.end_step(s, tokens=10, **({} if log_loss else {"loss": loss}))
            if log_loss:
                rec.log(s, loss=loss)
    close_all(recs)
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        ingest_run(run, options=IngestOptions(chunk_rows=chunk_rows) if chunk_rows else None)
    return [str(w.message) for w in got]


@pytest.mark.parametrize(("chunk_rows", "log_loss"), [(None, False), (60, False), (None, True)])
def test_an_in_process_rollback_is_a_restart_with_its_superseded_steps_kept(tmp_path, monkeypatch, chunk_rows, log_loss):
    run = str(tmp_path / "rb")
    said = _rollback_run(run, monkeypatch, chunk_rows=chunk_rows, log_loss=log_loss)
    steps, ranks, summary = read_outputs(run)
    assert not any("recorded more than once" in w for w in said + summary["warnings"])
    (r,) = summary["restarts"]
    assert r["in_process"] is True and r["why"] == "rollback" and r["attempt"] == 0 and r["ranks"] == [0, 1]
    assert (r["resumed_at_step"], r["previous_last_step"], r["superseded_steps"]) == (101, 150, 50)
    assert r["wasted_s"] == pytest.approx(50.0)
    # the kept line: 1-100 of the first pass, 101-200 of the second; step 101's period no longer holds the 50 s
    assert steps["step"].to_list() == list(range(1, 201))
    assert steps["loss"].to_list() == [float(s) for s in range(1, 101)] + [1000.0 + s for s in range(101, 201)]
    assert steps["step_time_s"].to_list() == pytest.approx([1.0] * 200)
    assert summary["wall_time_s"] == pytest.approx(200.0)
    # goodput: the 50 superseded seconds are wasted progress, and everything adds up
    g = summary["goodput"]
    assert g["buckets"]["wasted_progress"] == pytest.approx(50.0) and g["wasted_steps"] == 50
    assert g["productive_s"] + sum(g["buckets"].values()) == pytest.approx(g["total_s"])
    assert g["total_s"] == pytest.approx(255.0)
    (f,) = [f for f in summary["findings"] if f["kind"] == "restart"]
    assert (f["first_step"], f["last_step"]) == (101, 150) and "rolled back" in f["message"]
    assert "50 steps recomputed (50.0 s of wasted progress)" in f["message"]
    # the superseded steps, kept once (not a second copy of the run)
    sup = pl.read_parquet(os.path.join(run, "ingested", "superseded.parquet"))
    loss = sup.filter(pl.col("tag") == "loss").sort("step")
    assert loss["step"].to_list() == list(range(101, 151)) and loss["value"].to_list() == [float(s) for s in range(101, 151)]
    assert set(sup["reason"].to_list()) == {"rollback"} and set(sup["superseded_at_step"].to_list()) == {101}
    assert ranks.height == 400


def test_the_superseded_branch_is_drawn_faint_from_the_step_it_rolled_back_to(tmp_path, monkeypatch):
    from kforge_dash.browse.figures import metric_figure
    from kforge_dash.browse.series import RunSource, prepare_compare
    from kforge_dash.contract import read_summary_file

    run = str(tmp_path / "rb")
    _rollback_run(run, monkeypatch, world=1)
    src = RunSource("rb", __import__("pathlib").Path(run, "ingested", "steps.parquet"),
                    read_summary_file(os.path.join(run, "ingested", "summary.json")))
    data = prepare_compare([src], ["loss"])
    fig = metric_figure(data, "loss", {"rb": "#1f77b4"})
    (branch,) = [t for t in fig.data if t.name and "superseded" in t.name]
    assert list(branch.x) == list(range(100, 151))  # leaves the kept line at step 100
    assert list(branch.y)[0] == 100.0 and list(branch.y)[-1] == 150.0
    assert branch.opacity < 1 and "rollback" in branch.hovertemplate and "launch 0" in branch.hovertemplate


def test_two_rollbacks_to_one_checkpoint_are_two_branches(tmp_path, monkeypatch):
    """Steps 1-6 (loss 11-16), back to 3-8 (loss 103-108), back to 3-10: two restarts, and each keeps its own
    superseded values (step 3: 13 and 103, never a mean of the two)."""
    from kforge_dash.browse.lineage import branches

    run = str(tmp_path / "rb2")
    clock = install(monkeypatch, Clock())
    recs = open_ranks(run, 1)
    for base, steps in ((10.0, range(1, 7)), (100.0, range(3, 9)), (1000.0, range(3, 11))):
        for s in steps:
            recs[0].start_step()
            clock.t += 1.0
            recs[0].end_step(s, loss=base + s, tokens=10)
    close_all(recs)
    ingest_run(run)
    steps, _, summary = read_outputs(run)
    assert [(r["resumed_at_step"], r["previous_last_step"]) for r in summary["restarts"]] == [(3, 6), (3, 8)]
    sup = pl.read_parquet(os.path.join(run, "ingested", "superseded.parquet")).filter(pl.col("tag") == "loss")
    got = {(p, s): v for p, s, v in sup.select("previous_last_step", "step", "value").iter_rows()}
    assert got == {**{(6, s): 10.0 + s for s in range(3, 7)}, **{(8, s): 100.0 + s for s in range(3, 9)}}
    kept = steps.select("step", "loss").with_columns(__x=pl.col("step"))
    drawn = branches("rb2", os.path.join(run, "ingested", "steps.parquet"), summary, ["loss"], kept, "step")
    assert sorted(list(b.y) for b in drawn) == [[12.0, 13.0, 14.0, 15.0, 16.0],  # from kept step 2
                                                 [12.0, 103.0, 104.0, 105.0, 106.0, 107.0, 108.0]]
    assert sorted(b.text for b in drawn) == ["superseded by its rollback to step 3 from 6 (launch 0)",
                                             "superseded by its rollback to step 3 from 8 (launch 0)"]


@pytest.mark.parametrize("order", [(1, 2, 2, 3), (1, 3, 2, 4, 4)])  # a duplicate; one among steps ended out of order
def test_a_plain_duplicate_keeps_its_warning_and_is_no_restart(tmp_path, monkeypatch, order):
    run = str(tmp_path / "dup")
    clock = install(monkeypatch, Clock())
    recs = open_ranks(run, 1)
    for s in order:
        recs[0].start_step()
        clock.t += 1.0
        recs[0].end_step(s, loss=float(s), tokens=10)
    close_all(recs)
    with pytest.warns(UserWarning, match="rank 0: 1 steps recorded more than once in attempt 0"):
        ingest_run(run)
    _, _, summary = read_outputs(run)
    assert summary["restarts"] == [] and not os.path.exists(os.path.join(run, "ingested", "superseded.parquet"))


def test_the_run_page_shows_the_lineage_table_and_the_branch(tmp_path, monkeypatch):
    from dash_fixtures import detail_page

    _rollback_run(str(tmp_path / "rb"), monkeypatch, world=1)
    monkeypatch.undo()  # the recorder's clocks back (the page reads files only)
    at = detail_page(tmp_path, monkeypatch, "rb")
    assert not at.exception
    (table,) = [d for d in at.dataframe if "segment" in d.value.columns]
    rows = table.value.to_dict("records")
    assert [r["segment"] for r in rows] == ["launch 0", "launch 0, rollback 1"]
    got = (rows[1]["first_step"], rows[1]["resumed_from"], rows[1]["superseded_steps"], rows[1]["why"])
    assert got == (101, "100", "50", "rollback")
    assert any("superseded" in json.dumps(s) for s in chart_specs(at))
    assert any("rolled back in its own process" in json.dumps(s) for s in chart_specs(at))  # restart chart


def test_tensorboard_and_wandb_carry_the_kept_line_and_the_lineage_as_text(tmp_path, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from kforge_dash.export.history import load_history
    from kforge_dash.export.run import export_run
    from kforge_dash.export.wandb import wandb_summary

    run = str(tmp_path / "rb")
    _rollback_run(run, monkeypatch, world=1)
    assert export_run(run, wandb=False).tensorboard.ok
    acc = EventAccumulator(run, size_guidance={"tensors": 0, "scalars": 0})
    acc.Reload()
    loss = [(e.step, e.value) for e in acc.Scalars("1_train/loss")]
    assert [s for s, _ in loss] == list(range(1, 201)) and loss[100][1] == 1101.0  # the kept line, once per step
    (entry,) = acc.Tensors("lineage")
    said = entry.tensor_proto.string_val[0].decode()
    assert entry.step == 101 and "rollback in launch 0" in said and "resumed at step 101 after step 150" in said
    assert "50 steps run again" in said
    lineage = wandb_summary(load_history(run))["kforge/lineage"]
    assert "rollback in launch 0" in lineage and "after step 150" in lineage


@pytest.mark.parametrize("seen", [50, 150, 180])
def test_an_append_gives_what_a_full_ingest_gives(tmp_path, monkeypatch, seen):
    """Ingested while it ran (after ``seen`` of its 250 end_step calls) and again at the end: the same steps,
    restarts and superseded points as one ingest of the whole run (no period fixed twice)."""
    run = str(tmp_path / "rb")
    clock = install(monkeypatch, Clock())
    recs = open_ranks(run, 2, flush_every_steps=10)
    order = list(range(1, 151)) + list(range(101, 201))
    for n, s in enumerate(order):
        for rec in recs.values():
            rec.start_step()
        clock.t += 1.0
        for rec in recs.values():
            rec.end_step(s, loss=(1000.0 if n >= 150 else 0.0) + s, tokens=10)
        if n + 1 == seen:
            for rec in recs.values():
                rec.flush()
            ingest_run(run)
    close_all(recs)
    ingest_run(run)
    steps, _, summary = read_outputs(run)
    sup = pl.read_parquet(os.path.join(run, "ingested", "superseded.parquet"))
    ingest_run(run, options=IngestOptions(force=True))
    steps2, _, summary2 = read_outputs(run)
    assert steps.select("step", "step_time_s", "loss").equals(steps2.select("step", "step_time_s", "loss"))
    assert summary["restarts"] == summary2["restarts"] and summary["restarts"][0]["wasted_s"] == pytest.approx(50.0)
    assert summary["goodput"]["buckets"] == pytest.approx(summary2["goodput"]["buckets"])
    assert sup.equals(pl.read_parquet(os.path.join(run, "ingested", "superseded.parquet")))


def test_the_steps_a_relaunch_superseded_are_kept_and_named_by_it(tmp_path, monkeypatch):
    """Launch 0 ends steps 1-30 and closes; launch 1 resumes from the step-20 checkpoint: launch 0's rows of
    steps 21-30 (never read by the row pass) are kept as superseded by the relaunch, and drawn."""
    from kforge_dash.browse.figures import metric_figure
    from kforge_dash.browse.series import RunSource, prepare_compare

    run = str(tmp_path / "re")
    clock = install(monkeypatch, Clock())
    for launch, steps in ((0, range(1, 31)), (1, range(21, 41))):
        recs = open_ranks(run, 2)
        for s in steps:
            for rec in recs.values():
                rec.start_step()
            clock.t += 1.0
            for rec in recs.values():
                rec.end_step(s, loss=100.0 * launch + s, tokens=10)
        close_all(recs)
        clock.t += 10.0
    ingest_run(run)
    steps, _, summary = read_outputs(run)
    assert [(r["attempt"], r["why"], r["in_process"]) for r in summary["restarts"]] == [(1, "relaunch", False)]
    sup = pl.read_parquet(os.path.join(run, "ingested", "superseded.parquet")).filter(pl.col("tag") == "loss")
    assert sup["step"].to_list() == list(range(21, 31)) and sup["value"].to_list() == [float(s) for s in range(21, 31)]
    assert set(sup["reason"]) == {"relaunch"} and set(sup["attempt"]) == {0} and set(sup["superseded_at_step"]) == {21}
    src = RunSource("re", __import__("pathlib").Path(run, "ingested", "steps.parquet"), summary)
    (branch,) = [t for t in metric_figure(prepare_compare([src], ["loss"]), "loss", {}).data
                 if "superseded" in (t.name or "")]
    assert list(branch.x) == list(range(20, 31)) and "superseded by launch 1 (relaunch)" in branch.hovertemplate


def test_the_report_draws_the_branch_and_lists_the_rollback(tmp_path, monkeypatch):
    from kforge_dash.browse.report import build_report

    _rollback_run(str(tmp_path / "rb"), monkeypatch, world=1)
    page = build_report([tmp_path]).html
    assert "superseded by its rollback to step 101" in page and "rb: superseded" in page
    assert "<td>rollback</td>" in page  # the restarts table's why
