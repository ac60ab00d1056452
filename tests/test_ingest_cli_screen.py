"""kforge-ingest's screen: the two wall times labelled as on the run page, and -q that is quiet."""

from __future__ import annotations

import json
import shutil

from click.testing import CliRunner
from dash_fixtures import SAMPLE_RUNS

from kforge_dash.cli.ingest import main
from kforge_dash.export.tensorboard import kforge_event_files


def test_the_screen_labels_training_time_and_job_wall_clock(tmp_path):
    """preempted: 32.8 s of steps (their periods), 44.2 s of wall clock with the downtime; the screen said "wall time 33.1 s"."""
    run = tmp_path / "preempted"
    shutil.copytree(SAMPLE_RUNS / "preempted", run, ignore=shutil.ignore_patterns("ingested"))
    r = CliRunner().invoke(main, [str(run), "--no-wandb", "--no-tensorboard"])
    assert r.exit_code == 0, r.output
    s = json.loads((run / "ingested" / "summary.json").read_text())
    train, clock = s["wall_time_s"], s["goodput"]["total_s"]
    assert round(train, 1) == 32.8 and round(clock, 1) == 44.2
    assert "  training time 32.8 s · job wall clock 44.2 s (incl. downtime and startup)" in r.output.splitlines()
    assert "wall time" not in r.output


def test_no_tensorboard_note_only_when_the_event_file_is_older_and_never_under_quiet(tmp_path):
    run = tmp_path / "straggler"
    shutil.copytree(SAMPLE_RUNS / "straggler", run, ignore=shutil.ignore_patterns("ingested", "events.out.*"))
    first = CliRunner().invoke(main, [str(run), "--no-wandb", "-q"])
    assert first.exit_code == 0, first.output
    [event] = kforge_event_files(str(run))
    # unchanged since: the event file is current, no note (the old code printed one on every run)
    unchanged = CliRunner().invoke(main, [str(run), "--no-wandb", "--no-tensorboard"])
    assert unchanged.exit_code == 0 and "[unchanged]" in unchanged.output
    assert "kforge-ingest: note" not in unchanged.stderr
    # re-ingested without the export: the event file is older than the outputs; -q says nothing ...
    quiet = CliRunner().invoke(main, [str(run), "--no-wandb", "--no-tensorboard", "--force", "-q"])
    assert quiet.exit_code == 0 and quiet.stderr == "" and quiet.stdout == ""
    # ... and without -q one note names it
    loud = CliRunner().invoke(main, [str(run), "--no-wandb", "--no-tensorboard", "--force"])
    assert loud.exit_code == 0
    assert [ln for ln in loud.stderr.splitlines() if ln.startswith("kforge-ingest: note")] == [
        f"kforge-ingest: note: {event}: TensorBoard export switched off (--no-tensorboard); this event file of an "
        "earlier export was left as it is and may be older than the ingested outputs (delete it, or export again)"]
