"""kforge-report's run sections say what the stragglers cost and draw where the MFU went, prepared by the
same functions as the run page (browse/diagnosis.py); names from disk stay text."""

from __future__ import annotations

import html
import json
import re
import shutil

import pytest
from dash_fixtures import SAMPLE_RUNS

from kforge_dash import run_view
from kforge_dash.browse import diagnosis as prep_diagnosis
from kforge_dash.browse.report import build_report, write_report
from kforge_dash.ingest import run as ingest

CHROMIUM = "/usr/bin/chromium"
HOSTILE = "<img src=x onerror=alert(1)> Node-A"
SPEC = re.compile(r'<script type="application/json" class="run-figure-spec">(.*?)</script>', re.S)


def _specs(section: str, name: str) -> list[dict]:
    """The run figures of a report section named ``name`` (their PNG file name: kforge-NAME)."""
    specs = [json.loads(m) for m in SPEC.findall(section)]
    return [s for s in specs if s["config"]["toImageButtonOptions"]["filename"] == f"kforge-{name}"]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    dst = tmp_path_factory.mktemp("report-diagnosis") / "runs"
    shutil.copytree(SAMPLE_RUNS / "straggler", dst / "straggler", ignore=shutil.ignore_patterns("ingested"))
    ingest.ingest_run(dst / "straggler")
    return dst


def _summary(run):
    return json.loads((run / "ingested" / "summary.json").read_text())


def _section(page: str) -> str:
    (section,) = re.findall(r'<section class="run">.*?</section>', page, re.S)
    return section


def test_the_report_says_what_the_stragglers_cost_and_draws_the_mfu_waterfall(root):
    s = _summary(root / "straggler")
    section = _section(build_report([root]).html)
    sentence = run_view.what_if_text(s)
    assert sentence.startswith("Without its stragglers this run would have taken ") and "; rank 1 (" in sentence
    assert html.escape(sentence) in section
    (spec,) = _specs(section, "mfu_waterfall")
    (trace,) = spec["data"]
    fall = prep_diagnosis.mfu_waterfall(s)
    assert trace["type"] == "waterfall" and trace["x"] == fall.labels and "straggler wait" in trace["x"]
    assert trace["y"] == pytest.approx(fall.values) and trace["measure"] == fall.measures
    assert trace["y"][-1] == pytest.approx(s["mfu_waterfall"]["parts"]["achieved"])
    assert spec["layout"]["title"]["text"].startswith("where the MFU went")


def test_a_run_without_what_if_or_waterfall_has_neither(root, tmp_path):
    run = tmp_path / "runs" / "plain"
    shutil.copytree(root / "straggler", run)
    s = _summary(run)
    s.pop("what_if"), s.pop("mfu_waterfall")
    (run / "ingested" / "summary.json").write_text(json.dumps(s))
    section = _section(build_report([run]).html)
    assert "stragglers this run would have taken" not in section and not _specs(section, "mfu_waterfall")


def test_host_and_part_names_from_disk_stay_text(root, tmp_path):
    run = tmp_path / "runs" / "hostile"
    shutil.copytree(root / "straggler", run)
    s = _summary(run)
    s["what_if"]["by_rank"][0]["host"] = HOSTILE
    s["mfu_waterfall"]["parts"][HOSTILE] = 0.01
    (run / "ingested" / "summary.json").write_text(json.dumps(s))
    section = _section(build_report([run]).html)
    assert "<img" not in section
    assert html.escape(f"({HOSTILE}) alone cost") in section  # escaped, its case kept
    (spec,) = _specs(section, "mfu_waterfall")
    assert html.escape(HOSTILE) in spec["data"][0]["x"]  # plotly shows entities as the characters


@pytest.mark.slow
def test_chromium_draws_the_mfu_waterfall_of_the_report_offline(root, tmp_path):
    from playwright.sync_api import sync_playwright

    out = tmp_path / "report.html"
    write_report([root], out)
    fall = prep_diagnosis.mfu_waterfall(_summary(root / "straggler"))
    blocked = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu",
                                                                     "--disable-background-networking"])
        try:
            page = browser.new_page()
            page.route("**/*", lambda r: r.continue_() if r.request.url.startswith("file:")
                       else (blocked.append(r.request.url), r.abort()))
            page.goto(out.as_uri())
            figure = page.locator(".run-figure.js-plotly-plot", has=page.locator(".gtitle", has_text="where the MFU went"))
            figure.locator(".waterfalllayer .point").first.wait_for(timeout=60_000)
            ticks = figure.locator(".xtick text").all_text_contents()
            title = figure.locator(".gtitle").text_content()
        finally:
            browser.close()
    assert ticks == fall.labels and title.startswith("where the MFU went") and blocked == []
