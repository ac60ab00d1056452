"""The dashboard's chart element (views/chart.py): which plotly.js each chart loads, and the bundle shipped."""

import hashlib
import json
import re
from pathlib import Path

import plotly.graph_objects as go
from chart_specs import chart_elements
from dash_fixtures import write_run
from streamlit.testing.v1 import AppTest

from kforge_dash.browse import figures as prep_figures

BROWSE = Path(__file__).resolve().parent.parent / "kforge_dash" / "browse"


def test_the_basic_bundle_is_shipped_unmodified_with_its_licence():
    folder = BROWSE / "plotlyjs"
    digest = hashlib.sha256((folder / "plotly-basic.min.js").read_bytes()).hexdigest()
    assert digest in (folder / "README.md").read_text()  # the registry's file, as its README says
    assert (folder / "LICENSE").read_text().startswith("MIT License")
    head = (folder / "plotly-basic.min.js").read_text()[:200]
    assert re.search(r"plotly\.js \(basic - minified\) v4\.1\.1", head)
    package_data = (BROWSE.parent.parent / "pyproject.toml").read_text()
    assert "plotlyjs/plotly-basic.min.js" in package_data and "plotlyjs/LICENSE" in package_data


def test_scatter_bar_and_pie_take_the_basic_bundle_any_other_trace_the_full_one():
    spec = lambda *traces: prep_figures.figure_spec(go.Figure(list(traces)), "x")  # noqa: E731
    assert prep_figures.bundle_for(spec(go.Scatter(y=[1, 2]), go.Bar(y=[1]))) == "basic"
    assert prep_figures.bundle_for(spec(go.Scatter(y=[1, 2]), go.Heatmap(z=[[1]]))) == "full"
    assert prep_figures.bundle_for(spec(go.Waterfall(y=[1, 2]))) == "full"


def test_every_compare_chart_is_drawn_by_the_element_with_the_basic_bundle(tmp_path, monkeypatch):
    for i in range(2):
        write_run(tmp_path, f"run{i}", n=50, seed=i)
    monkeypatch.setenv("KFORGE_DASH_ROOT", str(tmp_path))
    at = AppTest.from_file(str(BROWSE / "app.py"), default_timeout=300).run()
    assert not at.exception and not at.get("plotly_chart")
    data = [json.loads(e.proto.json) for e in chart_elements(at)]
    assert len(data) >= 5
    assert all(d["src"].endswith("/plotly-basic.min.js") and d["select"] for d in data)
    assert all(json.loads(d["spec"])["layout"]["dragmode"] == "select" for d in data)
