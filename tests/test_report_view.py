"""kforge-report reads as the dashboard: goodput as its waterfall, its white charts, each note once, and a
config diff that says when a resume changed a value (issue 30, "seen by a new user")."""

from __future__ import annotations

import json
import re

from ingest_fixtures import close_all, open_ranks, run_steps

from kforge_dash.browse import findings as prep_findings
from kforge_dash.browse import runs as prep_runs
from kforge_dash.browse.report import build_report
from kforge_dash.ingest.run import ingest_run

SPEC = re.compile(r'<script type="application/json" class="run-figure-spec">(.*?)</script>', re.S)
CHARTS = re.compile(r'<script type="application/json" id="chart-specs">(.*?)</script>', re.S)


def _section(page: str, run: str) -> str:
    return page.split(f'<section class="run"><h3>{run}</h3>', 1)[1].split("</section>", 1)[0]


def test_the_report_draws_goodput_as_the_run_page_waterfall_on_white(sample_runs_copy):
    """It was an alphabetical table of every bucket, 0 s ones included, on plotly's grey template."""
    page = build_report([sample_runs_copy]).html
    section = _section(page, "straggler")
    assert "where the wall clock went" not in section  # the table
    specs = {s["config"]["toImageButtonOptions"]["filename"]: s for s in map(json.loads, SPEC.findall(section))}
    fall = specs["kforge-goodput_waterfall"]["data"][0]
    summary = json.loads((sample_runs_copy / "straggler" / "ingested" / "summary.json").read_text())
    want = prep_findings.goodput_waterfall(summary)
    assert fall["type"] == "waterfall" and fall["x"] == want.labels and fall["measure"] == want.measures
    zero = [k.replace("_", " ") for k, v in summary["goodput"]["buckets"].items() if not v]
    assert zero and not set(zero) & set(fall["x"])  # no 0 s bucket drawn
    values = [abs(v) for v in fall["y"][1:-1]]
    assert values == sorted(values, reverse=True)  # largest first, as the run page
    charts = json.loads(CHARTS.search(page).group(1))
    for layout in [c["layout"] for c in charts] + [s["layout"] for s in specs.values()]:
        template = layout["template"]["layout"]
        assert template["plot_bgcolor"] == "white" and template["paper_bgcolor"] == "white"


def test_notes_are_said_once_with_the_runs_of_one_kind_together(sample_runs_copy):
    """'X: loss the same as throttled (dashed)' was a line per run and metric."""
    report = build_report([sample_runs_copy])
    same = [n for n in report.notes if "the same as" in n]
    assert len(report.notes) == len(set(report.notes))
    assert len(same) == len({n.rsplit(" the same as ", 1)[1] for n in same})  # one line per earlier run
    (line,) = [n for n in same if n.startswith("preempted, ")]
    assert re.fullmatch(r"preempted, (\w[\w-]*, )*\w[\w-]*: loss(, \w+)* the same as [\w-]+ \(dashed\)", line), line


def test_the_config_diff_says_a_resume_changed_a_value(tmp_path, monkeypatch):
    """After a resume with another lr the diff showed the last launch's lr only, with no word of the change."""
    run = tmp_path / "runs" / "resumed"
    a0 = open_ranks(str(run), 1, hparams={"lr": 0.003, "seed": 1})
    clock = run_steps(monkeypatch, a0, range(1, 21), step_time=lambda r, s: 1.0)
    close_all(a0)
    a1 = open_ranks(str(run), 1, hparams={"lr": 0.001, "seed": 1})
    run_steps(monkeypatch, a1, range(21, 31), step_time=lambda r, s: 1.0, clock=clock)
    close_all(a1)
    summary = ingest_run(str(run)).summary
    assert summary["hparams"] == {"lr": 0.001, "seed": 1} and summary["hparams_changed"] == {"lr": [0.003, 0.001]}
    [info] = prep_runs.list_runs(tmp_path / "runs")
    assert prep_runs.config_diff([info])["key"].to_list() == ["hparams.lr"]
    page = build_report([tmp_path / "runs"]).html
    assert "<td>hparams.lr</td><td>0.001 (changed between launches: 0.003 → 0.001)</td>" in page
    assert "nothing to compare" not in page
