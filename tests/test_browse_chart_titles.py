"""The compare page's charts, their static previews and kforge-report's charts are titled with the column
registry's words ("step time (s)"), never a raw column name ("step_time_s"); the expected titles are read
from the registry (kforge_dash/column_registry.py), not written here."""

from __future__ import annotations

import json
import re
from pathlib import Path

from chart_specs import chart_specs
from dash_fixtures import write_run
from streamlit.testing.v1 import AppTest

from kforge_dash import column_registry as reg
from kforge_dash.browse import preview as prep_preview
from kforge_dash.browse import runs as prep_runs
from kforge_dash.browse import series as prep_series
from kforge_dash.browse.report import build_report

APP = Path(__file__).resolve().parent.parent / "kforge_dash" / "browse" / "app.py"
CHARTS = re.compile(r'<script type="application/json" id="chart-specs">(.*?)</script>', re.S)
RAW = ("step_time_s", "grad_norm", "tokens_per_sec", "mem_peak_bytes")  # what the titles said


def _runs(tmp_path):
    for i in range(2):
        write_run(tmp_path, f"run{i}", n=60, seed=i)
    return tmp_path


def test_every_compare_chart_is_titled_with_its_registry_label_and_unit(tmp_path, monkeypatch):
    monkeypatch.setenv("KFORGE_DASH_ROOT", str(_runs(tmp_path)))
    at = AppTest.from_file(str(APP), default_timeout=300)
    at.query_params.update(metrics=["loss", "step_time_s", "tokens_per_sec", "grad_norm", "mfu"])
    at.run()
    assert not at.exception
    specs = chart_specs(at)
    titles = [s["layout"]["title"]["text"] for s in specs]
    shown = at.multiselect(key="metrics").value
    assert len(shown) == 5 and sorted(titles) == sorted(reg.lookup(m).titled for m in shown)  # (two columns)
    assert not set(titles) & set(RAW)
    y = {t: s["layout"].get("yaxis", {}).get("title", {}).get("text") for t, s in zip(titles, specs)}
    assert y[reg.lookup("step_time_s").titled] == reg.lookup("step_time_s").unit  # the registry's unit
    assert y[reg.lookup("mfu").titled] is None  # the ticks say % already


def test_the_static_preview_has_the_charts_title(tmp_path):
    root = _runs(tmp_path)
    sources = [r.source() for r in prep_runs.list_runs(root) if r.ingested]
    data = prep_series.prepare_compare(sources, ["step_time_s"], x_axis="step", smoothing=0.0)
    svg = prep_preview.preview_svg(data, "step_time_s", {})
    title = re.search(r'font-weight="bold"[^>]*>([^<]*)</text>', svg).group(1)
    assert title == reg.lookup("step_time_s").titled != "step_time_s"


def test_every_report_chart_is_titled_with_its_registry_label(tmp_path):
    report = build_report([_runs(tmp_path)])
    specs = json.loads(CHARTS.search(report.html).group(1))
    titles = [s["layout"]["title"]["text"] for s in specs]
    assert len(titles) >= 5 and titles == [reg.lookup(m).titled for m in report.metrics]
    assert not set(titles) & set(RAW)
    assert reg.lookup("mem_peak_bytes").titled in titles  # "peak mem (GiB)"
