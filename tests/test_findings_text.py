"""Finding messages write their numbers with kforge_dash/text.py, as every front end does: durations
(text.duration: "0:02:05", "0.050 s"), percents ("23 %"), counts in words, rank lists and step ranges
("steps 1–250"). They formatted by hand ("125.0 s", "23%", "steps 1-250"). The expected text is what the
shared formatters give, read from the finding's own fields, never written here."""

from __future__ import annotations

import json
import shutil

import pytest
from dash_fixtures import SAMPLE_RUNS, ingest_sample_run

from kforge_dash import text
from kforge_dash.contract import INGESTED_DIR, SUMMARY_FILE
from kforge_dash.findings.finding import RunFacts
from kforge_dash.findings.timeline import restart_findings


@pytest.fixture(scope="module")
def findings(tmp_path_factory):
    out = {}
    for name in ("straggler", "four-ranks-stall"):
        run = tmp_path_factory.mktemp("text") / name
        shutil.copytree(SAMPLE_RUNS / name, run, ignore=shutil.ignore_patterns("ingested", "events.out.*"))
        ingest_sample_run(run)
        out[name] = json.loads((run / INGESTED_DIR / SUMMARY_FILE).read_text())["findings"]
    return out


def _of(found, kind):
    (f,) = [f for f in found if f["kind"] == kind]
    return f


def test_a_stragglers_message_has_the_shared_percent_duration_ranks_and_steps(findings):
    f = _of(findings["straggler"], "straggler")
    m = f["message"]
    assert m.startswith(text.rank_list(f["ranks"]).capitalize())  # "Rank 1"
    assert f"at {text.step_range(f['first_step'], f['last_step'])}" in m  # "steps 1–250"
    assert f"{text.percent(f['score'], 0)} of a step longer" in m  # "23 %", not "23%"
    assert f"waited {text.duration(f['cost_s'])} for it in all" in m


def test_a_data_stalls_message_has_the_shared_percent_and_duration(findings):
    f = _of(findings["four-ranks-stall"], "data_stall")
    m = f["message"]
    assert f"took {text.percent(f['score'], 0)} of each step at {text.step_range(f['first_step'], f['last_step'])}" in m
    assert f"({text.duration(f['cost_s'])} in all)" in m


def test_a_restarts_durations_read_as_text_duration_gives_them():
    """125 s down read "125.0 s" beside the run header's "0:02:05"; 0.05 s wasted read "0.1 s"."""
    summary = {
        "attempts": [{"attempt": 0, "first_step": 1}, {"attempt": 1, "first_step": 101}],
        "restarts": [{"attempt": 1, "resumed_at_step": 101, "previous_last_step": 130, "superseded_steps": 30}],
    }
    good = {"per_attempt": [
        {"attempt": 0, "shutdown_s": 5.0, "downtime_before_s": 0.0, "buckets": {"wasted_progress": 0.05}},
        {"attempt": 1, "shutdown_s": 0.0, "downtime_before_s": 120.0, "buckets": {"wasted_progress": 0.0}}]}
    facts = RunFacts(steps=None, ranks_path="", launches=[], summary=summary, opts=None, phases=None)
    (f,) = restart_findings(facts, good)
    assert f.score == pytest.approx(125.0)
    assert f"{text.counted(30, 'step')} recomputed ({text.duration(0.05)} of wasted progress)" in f.message
    assert f"and {text.duration(125.0)} down between launches" in f.message
    assert text.duration(125.0) == "0:02:05" and text.duration(0.05) == "0.050 s"
