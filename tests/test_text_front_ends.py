"""One summary through every front end: the kforge-ingest screen, the run page, kforge-report and
TensorBoard's text show each number in the same words (kforge_dash/text.py), small ones included."""

from __future__ import annotations

import html
import json
import re
import shutil

from click.testing import CliRunner
from dash_fixtures import SAMPLE_RUNS, detail_page
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from kforge_dash import text
from kforge_dash.browse import findings as prep_findings
from kforge_dash.browse.report import build_report
from kforge_dash.cli.ingest import main
from kforge_dash.export.tensorboard import kforge_event_files


def test_one_summary_reads_the_same_on_the_screen_the_page_the_report_and_tensorboard(tmp_path, monkeypatch):
    """A peak of 1,000 TFLOPS makes the straggler's MFU ~0.001 %: it read "0.0 %" (page, report) and
    "0.0%" (screen); the screen's goodput line mixed "{:,.1f} s" with the header's format."""
    run = tmp_path / "straggler"
    shutil.copytree(SAMPLE_RUNS / "straggler", run, ignore=shutil.ignore_patterns("ingested", "events.out.*"))
    r = CliRunner().invoke(main, [str(run), "--no-wandb", "--peak-tflops", "1000"])
    assert r.exit_code == 0, r.output
    s = json.loads((run / "ingested" / "summary.json").read_text())
    h = text.headline(s)
    assert 0 < s["mean_mfu"] < 1e-4 and re.fullmatch(r"0\.00[1-9]\d %", h[text.MEAN_MFU]), h
    assert re.fullmatch(r"0\.00[1-9]\d %", h[text.ACHIEVED_MFU])
    # the screen
    out = r.output.splitlines()
    assert f"  {text.MEAN_MFU} {h[text.MEAN_MFU]} (over the training time; {text.ACHIEVED_MFU} " \
           f"{h[text.ACHIEVED_MFU]} over the job wall clock)" in out
    assert f"  {text.FINAL_LOSS} {h[text.FINAL_LOSS]} (mean over ranks)   {text.BEST_LOSS} {h[text.BEST_LOSS]}" in out
    assert f"  {text.TRAINING_TIME} {h[text.TRAINING_TIME]}   {text.JOB_WALL_CLOCK} {h[text.JOB_WALL_CLOCK]} " \
           "(incl. downtime and startup)" in out
    (goodput,) = [ln for ln in out if ln.startswith("  goodput ")]
    g = s["goodput"]
    assert goodput.startswith(f"  goodput {h['goodput']} ({text.duration(g['productive_s'])} of "
                              f"{text.duration(g['total_s'])} productive; lost: straggler wait "
                              f"{text.duration(g['buckets']['straggler_wait'])}")
    # the run page
    at = detail_page(tmp_path, monkeypatch, "straggler")
    metrics = {m.label: m.value for m in at.metric}
    assert metrics[text.MEAN_MFU] == h[text.MEAN_MFU] and metrics["goodput"] == h["goodput"]
    assert metrics[f"{text.FINAL_LOSS} (mean of ranks)"] == h[text.FINAL_LOSS]
    assert metrics[text.TRAINING_TIME] == h[text.TRAINING_TIME] and metrics[text.JOB_WALL_CLOCK] == h[text.JOB_WALL_CLOCK]
    # the report
    page = build_report([run]).html
    for label in (text.MEAN_MFU, text.ACHIEVED_MFU, text.FINAL_LOSS, text.TRAINING_TIME, text.JOB_WALL_CLOCK, "goodput"):
        assert f"<td>{html.escape(h[label])}</td>" in page, label
    # a finding's facts: the page's card, the report's table and TensorBoard's text name the ranks alike
    (card,) = prep_findings.finding_cards(s)
    ranks = text.rank_list(s["findings"][0]["ranks"])
    assert ranks == "rank 1" and ranks in card.facts and f"<td>{html.escape(card.facts)}</td>" in page
    ea = EventAccumulator(kforge_event_files(str(run))[-1], size_guidance={"tensors": 0})
    ea.Reload()
    (event,) = ea.Tensors("findings/straggler")
    line = event.tensor_proto.string_val[0].decode()
    assert f" · {ranks} · " in line and f"from {text.step_range(s['findings'][0]['first_step'])} · " in line
