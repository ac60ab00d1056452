"""One summary through every front end: the kforge-ingest screen, the run page, kforge-report, TensorBoard's
text and labels and the W&B summary show each number in the same words (kforge_dash/text.py), small ones
included, from one RunView (kforge_dash/run_view.py) with the column registry's labels."""

from __future__ import annotations

import html
import json
import re
import shutil

from click.testing import CliRunner
from dash_fixtures import SAMPLE_RUNS, detail_page, shown
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from kforge_dash import column_registry as reg
from kforge_dash import text
from kforge_dash.browse.report import build_report
from kforge_dash.cli.ingest import main
from kforge_dash.export.history import load_history
from kforge_dash.export.tensorboard import kforge_event_files
from kforge_dash.export.wandb import wandb_summary
from kforge_dash.run_view import run_view

HEADER = ("steps", "world_size", "mean_mfu", "final_loss", "wall_time_s", "goodput.total_s", "goodput.fraction",
          "restarts")  # the run page's metrics


def test_one_summary_reads_the_same_on_the_screen_the_page_the_report_and_tensorboard(tmp_path, monkeypatch):
    """A peak of 1,000 TFLOPS makes the straggler's MFU ~0.001 %: it read "0.0 %" (page, report) and
    "0.0%" (screen); the screen's goodput line mixed "{:,.1f} s" with the header's format."""
    run = tmp_path / "straggler"
    shutil.copytree(SAMPLE_RUNS / "straggler", run, ignore=shutil.ignore_patterns("ingested", "events.out.*"))
    r = CliRunner().invoke(main, [str(run), "--no-wandb", "--peak-tflops", "1000"])
    assert r.exit_code == 0, r.output
    s = json.loads((run / "ingested" / "summary.json").read_text())
    view = run_view(s)
    h = {reg.label(f): view.text(f) for f in run_view(s).values}
    assert 0 < s["mean_mfu"] < 1e-4 and re.fullmatch(r"0\.00[1-9]\d %", h[reg.MEAN_MFU]), h
    assert re.fullmatch(r"0\.00[1-9]\d %", h[reg.ACHIEVED_MFU])
    # the screen
    out = r.output.splitlines()
    assert f"  {reg.MEAN_MFU} {h[reg.MEAN_MFU]} (over the training time; {reg.ACHIEVED_MFU} " \
           f"{h[reg.ACHIEVED_MFU]} over the job wall clock)" in out
    assert f"  {reg.FINAL_LOSS} {h[reg.FINAL_LOSS]} (mean over ranks)   {reg.BEST_LOSS} {h[reg.BEST_LOSS]}" in out
    assert f"  {reg.TRAINING_TIME} {h[reg.TRAINING_TIME]} · {reg.JOB_WALL_CLOCK} {h[reg.JOB_WALL_CLOCK]} " \
           "(incl. downtime and startup)" in out
    (goodput,) = [ln for ln in out if ln.startswith("  goodput ")]
    g = s["goodput"]
    assert goodput.startswith(f"  goodput {h['goodput']} ({text.duration(g['productive_s'])} of "
                              f"{text.duration(g['total_s'])} productive; lost: straggler wait "
                              f"{text.duration(g['buckets']['straggler_wait'])}")
    # the run page
    at = detail_page(tmp_path, monkeypatch, "straggler")
    metrics = {m.label: m.value for m in at.metric}
    assert metrics[reg.MEAN_MFU] == h[reg.MEAN_MFU] and metrics["goodput"] == h["goodput"]
    assert metrics[reg.FINAL_LOSS] == h[reg.FINAL_LOSS]
    assert metrics[reg.TRAINING_TIME] == h[reg.TRAINING_TIME] and metrics[reg.JOB_WALL_CLOCK] == h[reg.JOB_WALL_CLOCK]
    # the report
    page = build_report([run]).html
    for label in (reg.MEAN_MFU, reg.FINAL_LOSS, reg.TRAINING_TIME, "goodput"):  # the runs table
        assert f"<td>{html.escape(h[label])}</td>" in page, label
    assert f"{reg.ACHIEVED_MFU} {h[reg.ACHIEVED_MFU]}" in page  # the MFU waterfall's title
    assert html.escape(f"{reg.JOB_WALL_CLOCK} {h[reg.JOB_WALL_CLOCK]}") in page  # the run's header
    # a finding's facts: the page's card, the report's table and TensorBoard's text name the ranks alike
    (card,) = view.cards
    ranks = text.rank_list(s["findings"][0]["ranks"])
    assert ranks == "rank 1" and ranks in card.facts and f"<td>{html.escape(card.facts)}</td>" in page
    ea = EventAccumulator(kforge_event_files(str(run))[-1], size_guidance={"tensors": 0})
    ea.Reload()
    (event,) = ea.Tensors("findings/straggler")
    line = event.tensor_proto.string_val[0].decode()
    assert f" · {ranks} · " in line and f"from {text.step_range(s['findings'][0]['first_step'])} · " in line
    # One RunView, rendered thinly by each: the screen, the page, the report, TensorBoard and W&B
    assert view.what_if and f"  what-if: {view.what_if}" in out and f"  MFU inputs: {view.mfu_inputs}" in out
    assert f"  {view.labelled('steps')} (" in r.output and f"   {view.labelled('world_size')}   " in r.output
    assert metrics == {reg.label(f): view.text(f) for f in HEADER}  # every metric of the run page, label and text
    assert {m.label: m.help for m in at.metric}[reg.MEAN_MFU] == reg.MFU_HELP
    caption = " ".join(shown(c.value) for c in at.caption)
    assert f"Device: {view.device} · MFU inputs: {view.mfu_inputs}" in caption
    assert any(shown(i.value) == view.what_if for i in at.info)
    assert [shown(m.value) for m in at.markdown if view.cards[0].facts in shown(m.value)]
    for part in (view.device, view.wall_times, view.mfu_inputs, view.what_if, view.cards[0].message):
        assert html.escape(part) in page, part
    assert ea.SummaryMetadata("1_train/step_time_s").display_name == reg.lookup("step_time_s").titled == "step time (s)"
    assert ea.SummaryMetadata("1_train/loss").summary_description == text.md_text(reg.help_of("loss"))
    assert ea.SummaryMetadata("time/data_s").display_name == "data phase (s)"
    w = wandb_summary(load_history(run))
    assert (w["kforge/goodput"], w["kforge/restarts"], w["kforge/findings"]) == (
        view.values["goodput.fraction"], view.values["restarts"], view.values["findings"])
