"""The sample runs' findings and goodput, as kforge-ingest prints them and TensorBoard shows them."""

from __future__ import annotations

import glob
import json
import os
import shutil

import pytest
from click.testing import CliRunner
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from kforge_dash.cli.ingest import main

SAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "sample_runs")
CLEAN = ("baseline-lr1e-3", "baseline-lr3e-3", "baseline-lr1e-2")


@pytest.fixture(scope="module")
def ingested(tmp_path_factory):
    root = tmp_path_factory.mktemp("samples")
    for name in (*CLEAN, "preempted", "straggler", "spike-nan", "four-ranks-stall"):
        shutil.copytree(os.path.join(SAMPLES, name), root / name, ignore=shutil.ignore_patterns("ingested"))
    r = CliRunner().invoke(main, [str(root), "--json", "--no-wandb"])
    assert r.exit_code == 0, r.output
    return root, {os.path.basename(x["run_dir"]): x["summary"] for x in json.loads(r.stdout)["runs"]}


def _kinds(s):
    return sorted((f["kind"], f["metric"]) for f in s["findings"])


def test_each_sample_run_shows_its_kind(ingested):
    _, runs = ingested
    for name in CLEAN:  # clean runs: nothing to find
        assert runs[name]["findings"] == [], name
        assert runs[name]["goodput"]["fraction"] > 0.8
    spike = runs["spike-nan"]
    # the grad-norm spike at 151 is named in the loss spike's message, not a second finding (one fault, one finding)
    assert _kinds(spike) == [("loss_spike", "loss"), ("nonfinite", "grad_norm"), ("nonfinite", "loss")]
    (ls,) = [f for f in spike["findings"] if f["kind"] == "loss_spike" and f["metric"] == "loss"]
    assert ls["first_step"] == 151 and "grad-norm spike at the same step" in ls["message"]  # lr x30 at step 150
    (nan,) = [f for f in spike["findings"] if f["kind"] == "nonfinite" and f["metric"] == "loss"]
    assert (nan["first_step"], nan["ranks"]) == (200, [0])
    (st,) = runs["straggler"]["findings"]
    assert (st["kind"], st["ranks"], st["phase"], st["first_step"], st["last_step"]) == ("straggler", [1], "data", 1, 250)
    four = {f["kind"]: f for f in runs["four-ranks-stall"]["findings"]}
    assert sorted(four) == ["data_stall", "straggler"]  # the job's slow stretch from 100 is the data stall's
    assert (four["straggler"]["ranks"], four["straggler"]["phase"]) == ([2], "data")  # one slow rank of four
    assert (four["data_stall"]["first_step"], four["data_stall"]["last_step"]) == (100, 160)  # every loader from 100
    pre = runs["preempted"]
    (rs,) = pre["findings"]
    assert (rs["kind"], rs["first_step"], rs["last_step"]) == ("restart", 101, 130)
    g = pre["goodput"]
    assert g["wasted_steps"] == pre["restarts"][0]["superseded_steps"] == 30
    assert g["buckets"]["downtime"] > 1 and g["buckets"]["wasted_progress"] > 0
    for s in runs.values():
        g = s["goodput"]
        assert g["productive_s"] + sum(g["buckets"].values()) == pytest.approx(g["total_s"], abs=1e-6)
    # the straggler's cost is its goodput: the others waited 40 ms a step for rank 1's loader
    assert runs["straggler"]["goodput"]["buckets"]["straggler_wait"] > 0.8 * 250 * 0.040


def test_kforge_ingest_prints_findings_and_goodput(ingested):
    root, _ = ingested
    r = CliRunner().invoke(main, [str(root / "straggler"), "--no-wandb", "--no-tensorboard"])
    assert r.exit_code == 0, r.output
    assert "goodput " in r.output and " % (" in r.output and "lost: straggler wait " in r.output
    assert "findings (1):" in r.output and "[warning] straggler · steps " in r.output and ": Rank 1" in r.output
    r = CliRunner().invoke(main, [str(root / "baseline-lr3e-3"), "--no-wandb", "--no-tensorboard"])
    assert "findings: none" in r.output


def _texts(ea, tag):
    """(step, text) of a text-plugin tag, read back as TensorBoard's text plugin reads it."""
    return [(e.step, e.tensor_proto.string_val[0].decode()) for e in ea.Tensors(tag)]


def test_tensorboard_carries_findings_as_text_not_scalar_cards(ingested):
    """Findings are text summaries (the TEXT tab), not 1-point scalar cards sorting before 1_train/
    on TensorBoard's first screen (issue 21, item 10)."""
    root, runs = ingested
    (path,) = glob.glob(str(root / "spike-nan" / "events.out.tfevents.*"))
    ea = EventAccumulator(path, size_guidance={"scalars": 0, "tensors": 0})
    ea.Reload()
    assert not [t for t in ea.Tags()["scalars"] if t.startswith("findings/")]
    assert ea.SummaryMetadata("findings/loss_spike").plugin_data.plugin_name == "text"
    # one spike finding (the loss's; its grad-norm spike is named in it) at step 151: one text there
    ((step, text),) = _texts(ea, "findings/loss_spike")
    assert step == 151 and text.count("loss spike · from step 151") == 1 and "metric loss" in text
    assert [s for s, _ in _texts(ea, "findings/nonfinite")] == [200]
    (st,) = glob.glob(str(root / "straggler" / "events.out.tfevents.*"))
    ea = EventAccumulator(st, size_guidance={"tensors": 0})
    ea.Reload()
    finding = runs["straggler"]["findings"][0]
    assert _texts(ea, "findings/straggler") == [(1, f"**warning** · straggler · from step 1 · rank 1 · on "
                                                    f"{finding['hosts'][0]} · phase data")]
    # a run with no findings has no findings tags
    (clean,) = glob.glob(str(root / "baseline-lr3e-3" / "events.out.tfevents.*"))
    ea = EventAccumulator(clean)
    ea.Reload()
    assert not [t for kind in ("scalars", "tensors") for t in ea.Tags()[kind] if t.startswith("findings/")]
    assert "1_train/loss" in ea.Tags()["scalars"]


def test_new_steps_after_a_finding_are_appended_to_the_event_file(tmp_path, monkeypatch):
    """The findings' texts sit at their first steps and do not change while the run goes on, so an
    ingest of new steps still appends to TensorBoard's event file (tensorboard.py) instead of
    rewriting it."""
    from findings_fixtures import Clock, close_all, drive, install, open_ranks

    from kforge_dash import ingest_run
    from kforge_dash.export.run import export_run

    clock = install(monkeypatch, Clock())
    recs = open_ranks(tmp_path / "live", 2)
    values = lambda r, s: {"loss": float("nan") if s == 20 else 1.0, "tokens": 10}  # noqa: E731
    drive(recs, range(1, 41), clock, phases=lambda r, s: [("data", 0.01), ("fwd_bwd", 0.05)], values=values)
    for rec in recs.values():
        rec.flush()
    ingest_run(recs[0].run_dir)
    first = export_run(recs[0].run_dir, wandb=False).tensorboard
    size = os.path.getsize(first.path)
    drive(recs, range(41, 61), clock, phases=lambda r, s: [("data", 0.01), ("fwd_bwd", 0.05)], values=values)
    close_all(recs)
    assert ingest_run(recs[0].run_dir).appended
    second = export_run(recs[0].run_dir, wandb=False).tensorboard
    assert second.path == first.path and os.path.getsize(second.path) > size  # appended, same file
    ea = EventAccumulator(second.path, size_guidance={"scalars": 0, "tensors": 0})
    ea.Reload()
    assert [s for s, _ in _texts(ea, "findings/nonfinite")] == [20]
    assert [e.step for e in ea.Scalars("1_train/loss")] == list(range(1, 61))
